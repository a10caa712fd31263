"""STkThreshold: the solved λ against a bracketing root finder, Σp = k, the implicit gradient
(float64 gradcheck), the learned λ and its objective, the hard limit, one-line errors."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from scipy.optimize import brentq

from helpers import CONFIG_DIR
from topklab.engine.build import build
from topklab.operators.base import hard_topk
from topklab.operators.stk_threshold import STkThreshold, solve_threshold, srelu_slope
from topklab.smoothing import srelu


def slow_threshold(row: list[float], k: int, delta: float) -> float:
    """λ with Σ ½(1 + (x_i − λ)/√((x_i − λ)² + δ²)) = k, by Brent's method on a wide bracket."""

    def excess(lam):
        return sum(0.5 * (1 + (x - lam) / math.sqrt((x - lam) ** 2 + delta**2)) for x in row) - k

    return brentq(excess, min(row) - 10.0, max(row) + 10.0, xtol=1e-15, rtol=1e-15, maxiter=500)


def test_srelu_slope_is_the_derivative_of_srelu_and_stable_in_the_tail():
    z = torch.linspace(-3, 3, 61, dtype=torch.float64, requires_grad=True)
    (autograd,) = torch.autograd.grad(srelu(z, 0.1).sum(), z)
    torch.testing.assert_close(srelu_slope(z.detach(), 0.1), autograd, rtol=1e-12, atol=1e-15)
    far = torch.tensor([-1e4, -1e6], dtype=torch.float64)
    exact = torch.tensor([0.01**2 / (4 * 1e8), 0.01**2 / (4 * 1e12)], dtype=torch.float64)  # δ²/(4z²) + O(δ⁴/z⁴)
    torch.testing.assert_close(srelu_slope(far, 0.01), exact, rtol=1e-9, atol=0)


@pytest.mark.parametrize("delta,scale", [(0.01, 1.0), (0.5, 1.0), (1e-6, 1.0), (0.01, 1e3)])
def test_solved_threshold_matches_brent_and_sums_to_k(delta, scale):
    torch.manual_seed(0)
    x = scale * torch.randn(6, 40, dtype=torch.float64)
    x[2, :10] = x[2, 10]  # ties around the threshold
    for k in (1, 7, 39):
        lam = solve_threshold(x, k, delta)
        expected = torch.tensor([slow_threshold(row, k, delta) for row in x.tolist()], dtype=torch.float64)
        # the solver stops at |Σp − k| <= 1e-9, which pins λ down to 1e-9/|G'(λ)| (G' = −Σ ½δ²/r³):
        # where δ is small next to the gap around λ, G is flat and λ only loosely determined
        z = x - expected[:, None]
        slope = (0.5 * delta**2 / (z * z + delta**2) ** 1.5).sum(1)
        assert ((lam - expected).abs() <= 2e-9 / slope + 1e-12 * scale).all()
        p = STkThreshold(delta).soft_topk(x, k)
        assert ((p >= 0) & (p <= 1)).all()
        torch.testing.assert_close(p.sum(1), torch.full((6,), float(k), dtype=torch.float64), rtol=0, atol=1e-9)


def test_float32_sums_to_k_within_the_stated_tolerance():
    torch.manual_seed(1)
    x = torch.randn(32, 1000)
    p = STkThreshold(0.01).soft_topk(x, 500)
    assert p.dtype == torch.float32
    assert (p.sum(1) - 500).abs().max() <= 4 * 1000 * torch.finfo(torch.float32).eps + 1e-3


def test_gradcheck_solved_threshold_and_mask():
    torch.manual_seed(2)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    op = STkThreshold(delta=0.4, tol=1e-14)
    assert torch.autograd.gradcheck(lambda s: op.threshold(s, 3), (x,))
    assert torch.autograd.gradcheck(lambda s: op.soft_topk(s, 3), (x,))
    # Σp = k holds identically, so its gradient vanishes (the implicit-function theorem at work)
    (grad,) = torch.autograd.grad(op.soft_topk(x, 3).sum(), x)
    torch.testing.assert_close(grad, torch.zeros_like(grad), rtol=0, atol=1e-12)


def test_gradcheck_learned_threshold():
    torch.manual_seed(3)
    op = STkThreshold(delta=0.4, threshold="learned", lam_init=0.2).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    lam = op.lam.detach().clone().requires_grad_()
    call = torch.func.functional_call
    assert torch.autograd.gradcheck(lambda s, threshold: call(op, {"lam": threshold}, (s, 3)), (x, lam))


def test_learned_threshold_tracks_the_kth_largest_through_its_objective():
    torch.manual_seed(4)
    x = torch.randn(1, 50, dtype=torch.float64)
    op = STkThreshold(delta=0.01, threshold="learned", lam_init=3.0).double()
    optimizer = torch.optim.Adam(op.parameters(), lr=0.05)
    scores = x.clone().requires_grad_()
    for _ in range(250):
        optimizer.zero_grad()
        op.objective(scores, 10).backward()
        optimizer.step()
    assert scores.grad is None  # detach_scores: only λ learns from the objective
    kth, next_ = x.topk(11).values[0, 9:11].tolist()
    assert next_ - 0.02 <= op.lam.item() <= kth + 0.02
    torch.testing.assert_close(op.soft_topk(x, 10).sum(), torch.tensor(10.0, dtype=torch.float64), rtol=0, atol=0.1)
    # the STk aggregate (detach_scores=False) does send a gradient to the scores
    op.objective(scores, 10, detach_scores=False).backward()
    assert scores.grad is not None and scores.grad.abs().sum() > 0


def test_solved_objective_is_the_smoothed_topk_sum_over_n():
    torch.manual_seed(5)
    x = torch.randn(4, 30, dtype=torch.float64)
    op = STkThreshold(0.01)
    topk_sum = x.topk(5).values.sum(1)
    # SReLU lies within δ/2 of ReLU (Prop. 1), so Eq. 3 is within nδ/2 of the top-k sum
    assert abs(op.objective(x, 5).item() * 30 - topk_sum.mean().item()) <= 30 * 0.01 / 2


def test_hard_limit_and_k_equal_n():
    torch.manual_seed(6)
    x = torch.randperm(40).reshape(2, 20).to(torch.float64) / 10  # distinct, gaps >= 0.1
    torch.testing.assert_close(STkThreshold(1e-6).soft_topk(x, 7), hard_topk(x, 7), rtol=0, atol=1e-8)
    between = x.topk(8).values[0, 6:8].mean().item()  # λ between the 7th and 8th largest of row 0
    learned = STkThreshold(1e-6, threshold="learned", lam_init=between)
    torch.testing.assert_close(learned.soft_topk(x[:1], 7).detach(), hard_topk(x[:1], 7), rtol=0, atol=1e-8)
    ones = STkThreshold(0.01).soft_topk(x.requires_grad_(), 20)
    assert torch.equal(ones, torch.ones_like(x))
    ones.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"delta": 0}, r"delta=0 must be a number > 0 \(smaller = sharper\)"),
        ({"threshold": "fixed"}, r"threshold='fixed' is unknown; choose one of solved, learned"),
        ({"lam_init": float("nan")}, r"lam_init=nan must be a finite number"),
        ({"tol": 0.0}, r"tol=0.0 must be a number > 0"),
        ({"max_iter": 0}, r"max_iter=0 must be an int >= 1"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        STkThreshold(**kwargs)
    assert "\n" not in str(error.value)


def test_bad_input_is_a_one_line_error():
    for threshold in ("solved", "learned"):
        op = STkThreshold(threshold=threshold)
        for scores, k, message in ((torch.tensor(1.0), 1, "shape"), (torch.zeros(2, 5), 0, "k=0")):
            with pytest.raises(ValueError, match=message) as error:
                op.soft_topk(scores, k)
            assert "\n" not in str(error.value)


def test_config_builds_the_operator():
    op = build(OmegaConf.load(CONFIG_DIR / "operator" / "stk_threshold.yaml"), "operator")
    assert isinstance(op, STkThreshold) and not op.sums_to_k and not op.stochastic
    assert (
        op.soft_topk(torch.randn(4, 10, dtype=torch.float64), 3)
        .sum(1)
        .allclose(torch.full((4,), 3.0, dtype=torch.float64))
    )
