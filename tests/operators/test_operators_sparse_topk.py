"""SparseTopK (Sander et al., ICML 2023): PAV and Dykstra against slow obvious references, the
promised properties (Σp = k, exact 0s and 1s, hard limit), float64 gradchecks, one-line errors."""

import itertools
import warnings

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy.optimize import minimize

from helpers import CONFIG_DIR
from topklab.engine.build import build
from topklab.operators.base import hard_topk
from topklab.operators.sparse_topk import SparseTopK, isotonic_dykstra, isotonic_pav


def isotonic_brute_force(y: np.ndarray) -> np.ndarray:
    """Non-increasing isotonic regression by enumeration: the optimum is constant on blocks of
    consecutive items with the block means as values, so it is the best non-increasing candidate
    among the 2^(n−1) splits of the row into blocks."""
    n, best, best_error = len(y), None, np.inf
    for cuts in itertools.product([False, True], repeat=n - 1):
        edges = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        v = np.concatenate([np.full(b - a, y[a:b].mean()) for a, b in zip(edges, edges[1:])])
        if np.all(np.diff(v) <= 1e-12) and ((v - y) ** 2).sum() < best_error:
            best, best_error = v, ((v - y) ** 2).sum()
    return best


def capped_simplex_projection(z: np.ndarray, k: int) -> np.ndarray:
    """Euclidean projection onto {μ ∈ [0, 1]^n : Σμ = k} = P(w): clip(z − τ, 0, 1), τ by bisection."""
    low, high = z.min() - 1.0, z.max()
    for _ in range(200):
        tau = 0.5 * (low + high)
        low, high = (tau, high) if np.clip(z - tau, 0, 1).sum() > k else (low, tau)
    return np.clip(z - 0.5 * (low + high), 0, 1)


def regularised_lp(x: np.ndarray, k: int, ell: float, p: float) -> np.ndarray:
    """The definition, solved by a generic QP/NLP solver: argmax_{μ ∈ [0,1]^n, Σμ = k} ⟨μ, x⟩ − (ℓ/p)Σμ^p."""
    n = len(x)
    result = minimize(
        lambda mu: -(mu @ x) + ell / p * (np.abs(mu) ** p).sum(),
        np.full(n, k / n),
        jac=lambda mu: -x + ell * np.sign(mu) * np.abs(mu) ** (p - 1),
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n,
        constraints=[{"type": "eq", "fun": lambda mu: mu.sum() - k}],
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert result.success, result.message
    return result.x


@pytest.mark.parametrize("seed", range(6))
def test_pav_and_dykstra_match_brute_force_isotonic_regression(seed):
    generator = torch.Generator().manual_seed(seed)
    y = torch.randn(3, 7, generator=generator, dtype=torch.float64).cumsum(1) * 0.3 + torch.randn(
        3, 7, generator=generator, dtype=torch.float64
    )  # mixed trends: several pooled blocks per row
    expected = torch.tensor(np.stack([isotonic_brute_force(row) for row in y.numpy()]))
    pav, _ = isotonic_pav(y, torch.zeros(7, dtype=torch.float64), 2)
    dykstra, _, certified = isotonic_dykstra(y, max_iter=20000, tol=1e-10)
    assert certified.all()
    torch.testing.assert_close(pav, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(dykstra, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("ell,k", [(0.3, 1), (1.0, 2), (3.0, 4)])
def test_mask_is_the_regularised_top_k_lp(ell, k):
    """p = 2 against SLSQP on the definition and the closed-form projection; p = 4/3 against SLSQP."""
    x = torch.tensor([[0.3, -1.2, 2.0, 0.25, 1.1, -0.4], [1.0, 1.0, 0.9, -3.0, 0.95, 2.5]], dtype=torch.float64)
    for p, solvers in ((2, ("pav", "dykstra")), (4 / 3, ("pav",))):
        expected = np.stack([regularised_lp(row, k, ell, p) for row in x.numpy()])
        if p == 2:
            closed = np.stack([capped_simplex_projection(row / ell, k) for row in x.numpy()])
            np.testing.assert_allclose(closed, expected, atol=1e-6)
            expected = closed
        for solver in solvers:
            got = SparseTopK(ell, p=p, solver=solver, tol=1e-10).soft_topk(x, k)
            np.testing.assert_allclose(got.numpy(), expected, atol=1e-12 if p == 2 else 1e-6)


def test_pav_and_dykstra_agree_and_sum_to_k_with_exact_zeros_and_ones():
    torch.manual_seed(0)
    x = torch.randn(16, 60, dtype=torch.float64)
    x[3, 10:14] = x[3, 0]  # a tie group
    for ell, k in ((0.05, 3), (0.3, 10), (1.0, 30)):
        pav = SparseTopK(ell).soft_topk(x, k)
        dykstra = SparseTopK(ell, solver="dykstra", max_iter=20000, tol=1e-9).soft_topk(x, k)
        torch.testing.assert_close(pav, dykstra, rtol=0, atol=1e-6)
        torch.testing.assert_close(pav.sum(1), torch.full((16,), float(k), dtype=torch.float64), rtol=0, atol=1e-12)
        closed = torch.tensor(np.stack([capped_simplex_projection(row / ell, k) for row in x.numpy()]))
        # the entries the projection clips (up to the bisection's rounding) are exactly 0 or 1
        assert torch.equal(pav == 0, closed <= 1e-12) and torch.equal(pav == 1, closed >= 1 - 1e-12)
        assert ((pav >= 0) & (pav <= 1)).all()
    smooth = SparseTopK(0.3, p=4 / 3).soft_topk(x, 10)
    torch.testing.assert_close(smooth.sum(1), torch.full((16,), 10.0, dtype=torch.float64), rtol=0, atol=1e-9)
    assert (smooth == 0).any() and (smooth == 1).any()


def test_float32_keeps_exact_zeros_ones_and_sum():
    torch.manual_seed(1)
    x = 100 * torch.randn(8, 200)  # large t = x/ℓ: t − (t − 1) would not round to exactly 1
    for solver in ("pav", "dykstra"):
        mask = SparseTopK(0.5, solver=solver).soft_topk(x, 20)
        assert mask.dtype == torch.float32 and ((mask == 0) | (mask == 1)).float().mean() > 0.9
        torch.testing.assert_close(mask.sum(1), torch.full((8,), 20.0), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "options",
    [{}, {"solver": "dykstra", "tol": 1e-10, "max_iter": 20000}, {"p": 4 / 3}],
    ids=["pav", "dykstra", "pav-p4/3"],
)
def test_gradcheck(options):
    torch.manual_seed(2)
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    op = SparseTopK(0.8, **options)
    assert torch.autograd.gradcheck(lambda s: op.soft_topk(s, 4), (x,))
    # the pooled entries carry the gradient; the exact 0s and 1s are locally constant
    mask = op.soft_topk(x, 4)
    (jacobian,) = torch.autograd.functional.jacobian(lambda s: op.soft_topk(s, 4), (x,))
    clipped = (mask == 0) | (mask == 1)
    assert torch.all(jacobian[clipped] == 0)


def test_hard_limit_and_uniform_limit():
    torch.manual_seed(3)
    x = torch.randperm(40).reshape(2, 20).to(torch.float64)  # distinct, gaps >= 1
    for options in ({}, {"solver": "dykstra"}, {"p": 4 / 3}):
        assert torch.equal(SparseTopK(0.5, **options).soft_topk(x, 7), hard_topk(x, 7))
    torch.testing.assert_close(SparseTopK(1e6).soft_topk(x, 5), torch.full_like(x, 5 / 20), rtol=0, atol=1e-4)


def test_dykstra_warns_when_it_cannot_certify_in_max_iter():
    x = torch.linspace(0, 1, 200, dtype=torch.float64)[None]  # one pooled block of ~all items
    with pytest.warns(RuntimeWarning, match="raise max_iter or use solver='pav'"):
        SparseTopK(1.0, solver="dykstra", max_iter=20).soft_topk(x, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SparseTopK(0.001, solver="dykstra", max_iter=20).soft_topk(x, 100)  # singletons: certified at once


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"regularization": 0.0}, r"regularization=0.0 must be a number > 0 \(smaller = sharper and sparser\)"),
        ({"p": 1.5}, r"p=1.5 is not supported; choose 2 .* or 4/3"),
        ({"solver": "sinkhorn"}, r"solver='sinkhorn' is unknown; choose one of pav, dykstra"),
        ({"solver": "dykstra", "p": 4 / 3}, r"solver='dykstra' supports p=2 only; use solver='pav' for p=4/3"),
        ({"max_iter": 0}, r"max_iter=0 must be an int >= 1"),
        ({"tol": -1.0}, r"tol=-1.0 must be a number > 0"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        SparseTopK(**kwargs)
    assert "\n" not in str(error.value)


def test_bad_input_is_a_one_line_error():
    op = SparseTopK()
    for scores, k, message in (
        (torch.tensor(1.0), 1, "shape"),
        (torch.zeros(2, 5), 6, "k=6"),
        (torch.zeros(2, 5, dtype=torch.long), 1, "floating-point"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            op.soft_topk(scores, k)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="not a top-k permutation"):
        op.permutation(torch.zeros(2, 5), 2)


def test_config_builds_the_operator():
    op = build(OmegaConf.load(CONFIG_DIR / "operator" / "sparse_topk.yaml"), "operator")
    assert isinstance(op, SparseTopK) and op.sums_to_k and op.sparse and not op.stochastic
    assert op.soft_topk(torch.randn(4, 10), 3).sum(1).allclose(torch.full((4,), 3.0))
