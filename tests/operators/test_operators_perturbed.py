"""PerturbedTopK: the Monte-Carlo forward against the definition and an exact expectation, the
stochastic gradient estimator against finite differences (common random numbers), the hard
limit, seeding, one-line errors."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONFIG_DIR
from topklab.engine.build import build
from topklab.operators.base import hard_permutation, hard_topk
from topklab.operators.perturbed import PerturbedTopK


def with_noise(op: PerturbedTopK, noise: torch.Tensor) -> PerturbedTopK:
    """``op`` drawing exactly ``noise`` (S, batch, n): lets a test hold the draws fixed."""
    op.noise = lambda scores: noise.to(scores.dtype)
    return op


def test_forward_is_the_mean_of_hard_topk_and_sums_to_k():
    torch.manual_seed(0)
    x, noise = torch.randn(3, 8, dtype=torch.float64), torch.randn(50, 3, 8, dtype=torch.float64)
    op = with_noise(PerturbedTopK(sigma=0.7, num_samples=50), noise)
    expected = torch.stack([hard_topk(x + 0.7 * z, 3) for z in noise]).mean(0)
    expected_perm = torch.stack([hard_permutation(x + 0.7 * z, 3) for z in noise]).mean(0)
    torch.testing.assert_close(op.soft_topk(x, 3), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(op.permutation(x, 3), expected_perm, rtol=0, atol=1e-15)
    torch.testing.assert_close(
        op.soft_topk(x, 3).sum(1), torch.full((3,), 3.0, dtype=torch.float64), rtol=0, atol=1e-12
    )
    permutation = op.permutation(x, 3)
    torch.testing.assert_close(permutation.sum(1), torch.ones(3, 3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_forward_matches_the_exact_expectation():
    """n = 3, top-1: P(i is the largest) = ∫ φ(z) Π_{j≠i} Φ((x_i − x_j)/σ + z) dz (quadrature),
    within 5 standard errors of the 20000-draw mean (each entry's standard error <= ½/√20000)."""
    x, sigma = np.array([0.3, 0.0, -0.4]), 0.5
    z = np.linspace(-9, 9, 4001)
    phi = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    cdf = np.vectorize(lambda u: 0.5 * math.erfc(-u / math.sqrt(2)))
    exact = [
        np.trapezoid(phi * np.prod([cdf((x[i] - x[j]) / sigma + z) for j in range(3) if j != i], axis=0), z)
        for i in range(3)
    ]
    got = PerturbedTopK(sigma, num_samples=20000, seed=0).soft_topk(torch.tensor(x)[None], 1)[0].numpy()
    assert np.abs(got - exact).max() <= 5 * 0.5 / math.sqrt(20000)
    # top-2 of 3 = 1 − bottom-1 = 1 − top-1 of −x
    got2 = PerturbedTopK(sigma, num_samples=20000, seed=1).soft_topk(torch.tensor(-x)[None], 2)[0].numpy()
    assert np.abs(got2 - (1 - np.array(exact))).max() <= 5 * 0.5 / math.sqrt(20000)


@pytest.mark.parametrize("as_permutation", [False, True], ids=["soft_topk", "permutation"])
def test_gradient_estimator_agrees_with_finite_differences(as_permutation):
    """f(x) = ⟨c, y_σ(x)⟩ with y_σ the perturbed top-k. The backward's gradient (Berthet et al.'s
    E[⟨c, y(x + σZ)⟩ Z]/σ) must equal, first, the mean of its per-draw terms computed from the
    definition with the same draws, and second, the central finite difference of the Monte-Carlo
    estimate of f with common random numbers (the same draws at x ± h·e_i), up to

    - the sampling error of the paired difference: per draw, (estimator term − finite-difference
      term) is i.i.d. over the draws, so its mean is within 5 of its own standard errors of its
      expectation (5 SE: a false alarm has probability < 1e-6 per entry);
    - the finite-difference bias h²/6·|∂³f|: f is a Gaussian smoothing of a function bounded by
      B = Σ|c|, whose third derivative is at most B·E|He₃(Z)|/σ³ <= 1.6·B/σ³ (E|Z³ − 3Z| < 1.6).
    Both sides estimate the same ∂f/∂x_i, so passing checks the estimator's scale, sign and
    direction; the last assertion makes sure the tolerance is well below the gradient's size."""
    torch.manual_seed(0)
    n, k, sigma, h, draws = 5, 2, 1.0, 0.1, 100_000
    x = torch.tensor([[0.4, -0.3, 0.9, 0.0, -1.1]], dtype=torch.float64)
    c = torch.tensor([1.0, -1.0, 2.0, 0.5, -2.0], dtype=torch.float64)
    if as_permutation:  # different weights for the top-1 and top-2 columns
        c = torch.stack((c, torch.tensor([-1.5, 0.5, 1.0, 1.0, 0.0], dtype=torch.float64)), dim=1)
    noise = torch.randn(draws, 1, n, dtype=torch.float64)
    op = with_noise(PerturbedTopK(sigma, num_samples=draws), noise)
    scores = x.clone().requires_grad_()
    out = op.permutation(scores, k) if as_permutation else op.soft_topk(scores, k)
    (gradient,) = torch.autograd.grad((out[0] * c).sum(), scores)

    def per_draw(point):  # ⟨c, y(point + σZ_s)⟩ for every draw s: (draws,)
        perturbed = point + sigma * noise[:, 0, :]
        y = hard_permutation(perturbed, k) if as_permutation else hard_topk(perturbed, k)
        return (y * c).reshape(draws, -1).sum(1)

    estimator_terms = per_draw(x)[:, None] * noise[:, 0, :] / sigma  # (draws, n)
    torch.testing.assert_close(gradient[0], estimator_terms.mean(0), rtol=0, atol=1e-12)
    eye = torch.eye(n, dtype=torch.float64)
    fd_terms = torch.stack([(per_draw(x + h * eye[i]) - per_draw(x - h * eye[i])) / (2 * h) for i in range(n)], 1)
    paired = estimator_terms - fd_terms
    standard_error = paired.std(0) / math.sqrt(draws)
    bias = h**2 / 6 * 1.6 * c.abs().sum() / sigma**3
    assert ((paired.mean(0)).abs() <= 5 * standard_error + bias).all(), (paired.mean(0), standard_error, bias)
    assert gradient.abs().max() > 3 * (5 * standard_error.max() + bias)


def test_hard_limit():
    x = torch.randperm(24).reshape(2, 12).to(torch.float64)  # gaps >= 1
    op = PerturbedTopK(sigma=1e-6, num_samples=8, seed=0)
    assert torch.equal(op.soft_topk(x, 5), hard_topk(x, 5))
    assert torch.equal(op.permutation(x, 5), hard_permutation(x, 5))


def test_seeds():
    x = torch.randn(4, 10)
    same = [PerturbedTopK(0.5, num_samples=20, seed=7).soft_topk(x, 3) for _ in range(2)]
    assert torch.equal(same[0], same[1])
    assert not torch.equal(same[0], PerturbedTopK(0.5, num_samples=20, seed=8).soft_topk(x, 3))
    op = PerturbedTopK(0.5, num_samples=20, seed=7)
    assert not torch.equal(op.soft_topk(x, 3), op.soft_topk(x, 3))  # seeded once: the stream moves on
    torch.manual_seed(3)
    first = PerturbedTopK(0.5, num_samples=20).soft_topk(x, 3)
    torch.manual_seed(3)
    assert torch.equal(first, PerturbedTopK(0.5, num_samples=20).soft_topk(x, 3))  # seed=None: global RNG


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"sigma": 0}, r"sigma=0 must be a number > 0 \(smaller = closer to the hard top-k, noisier gradient\)"),
        ({"num_samples": 0}, r"num_samples=0 must be an int >= 1"),
        ({"num_samples": 2.5}, r"num_samples=2.5 must be an int >= 1"),
        ({"seed": "a"}, r"seed='a' must be an int or null"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        PerturbedTopK(**kwargs)
    assert "\n" not in str(error.value)


def test_bad_input_is_a_one_line_error():
    op = PerturbedTopK(num_samples=2)
    for call in (op.soft_topk, op.permutation):
        for scores, k, message in ((torch.tensor(1.0), 1, "shape"), (torch.zeros(2, 5), 6, "k=6")):
            with pytest.raises(ValueError, match=message) as error:
                call(scores, k)
            assert "\n" not in str(error.value)


def test_config_builds_the_operator():
    op = build(OmegaConf.load(CONFIG_DIR / "operator" / "perturbed.yaml"), "operator")
    assert isinstance(op, PerturbedTopK) and op.stochastic and op.sums_to_k and op.gives_permutation
    assert op.permutation(torch.randn(4, 10), 3).shape == (4, 10, 3)
