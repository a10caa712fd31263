"""LapSum, DFTopK and SOFT top-k under the operator API: float64 gradchecks, slow obvious references,
the hard limit, Σp = k where promised, one-line errors."""

import math

import numpy as np
import pytest
import torch

from topklab.operators import DFTopK, LapSum, SoftTopKOT, hard_permutation, hard_topk


def laplace_cdf(t: float) -> float:
    return 0.5 * math.exp(t) if t <= 0 else 1.0 - 0.5 * math.exp(-t)


def lapsum_by_bisection(row: list[float], k: int, alpha: float) -> list[float]:
    """p_i = F((x_i − b)/α) with b found by bisection on Σ F((x_i − b)/α) = k (decreasing in b)."""
    low, high = min(row) - 50 * alpha, max(row) + 50 * alpha
    for _ in range(200):
        middle = 0.5 * (low + high)
        if sum(laplace_cdf((x - middle) / alpha) for x in row) > k:
            low = middle
        else:
            high = middle
    return [laplace_cdf((x - 0.5 * (low + high)) / alpha) for x in row]


def dftopk_by_sorting(row: list[float], k: int, tau: float) -> list[float]:
    ranked = sorted(row, reverse=True)
    threshold = 0.5 * (ranked[k - 1] + ranked[k])
    return [1.0 / (1.0 + math.exp(-(x - threshold) / tau)) for x in row]


def soft_ot_by_plain_sinkhorn(
    row: np.ndarray, anchors, masses, epsilon: float, rounds: int = 20000, divisor: float | None = None
) -> np.ndarray:
    """Xie et al.'s plan with the textbook (not log-domain) Sinkhorn scaling, μ = 1/n; the cost is
    divided by ``divisor`` (default: the row's own largest entry)."""
    n = len(row)
    cost = (row[:, None] - np.asarray(anchors)[None, :]) ** 2
    kernel = np.exp(-cost / (cost.max() if divisor is None else divisor) / epsilon)
    mu, nu = np.full(n, 1.0 / n), np.asarray(masses)
    v = np.ones(len(anchors))
    for _ in range(rounds):
        u = mu / (kernel @ v)
        v = nu / (kernel.T @ u)
    return u[:, None] * kernel * v[None, :]


def test_lapsum_matches_bisection_and_sums_to_k():
    torch.manual_seed(0)
    scores = torch.randn(4, 11, dtype=torch.float64) * 2
    for alpha in (0.3, 1.0, 4.0):
        p = LapSum(alpha).soft_topk(scores, 4)
        for row, ours in zip(scores.tolist(), p):
            assert torch.allclose(
                ours, torch.tensor(lapsum_by_bisection(row, 4, alpha), dtype=torch.float64), atol=1e-10
            )
        assert torch.allclose(p.sum(1), torch.full((4,), 4.0, dtype=torch.float64), atol=1e-10)


def test_lapsum_permutation_columns_are_differences_of_nested_top_j():
    scores = torch.randn(3, 8, dtype=torch.float64)
    operator = LapSum(0.5)
    P = operator.permutation(scores, 4)
    for j in range(4):
        upper = operator.soft_topk(scores, j + 1)
        lower = operator.soft_topk(scores, j) if j else torch.zeros_like(upper)
        assert torch.allclose(P[:, :, j], upper - lower, atol=1e-10)
    assert (P >= -1e-12).all() and torch.allclose(P.sum(1), torch.ones(3, 4, dtype=torch.float64), atol=1e-10)


def test_dftopk_matches_the_sorted_midpoint_rule():
    scores = torch.randn(5, 9, dtype=torch.float64)
    p = DFTopK(0.7).soft_topk(scores, 3)
    for row, ours in zip(scores.tolist(), p):
        assert torch.allclose(ours, torch.tensor(dftopk_by_sorting(row, 3, 0.7), dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_soft_topk_ot_matches_a_plain_sinkhorn(k):
    rng = np.random.default_rng(1)
    row = rng.normal(size=7)
    n, epsilon = 7, 0.2
    operator = SoftTopKOT(epsilon=epsilon, max_iter=5000, tol=0.0)
    expected = n * soft_ot_by_plain_sinkhorn(-row, [0.0, 1.0], [k / n, (n - k) / n], epsilon)[:, 0]
    ours = operator.soft_topk(torch.tensor(row[None]), k)[0].numpy()
    assert np.allclose(ours, expected, atol=1e-8)
    anchors = [float(k - j) for j in range(k + 1)]
    plan = soft_ot_by_plain_sinkhorn(row, anchors, [1.0 / n] * k + [(n - k) / n], epsilon)
    assert np.allclose(operator.permutation(torch.tensor(row[None]), k)[0].numpy(), n * plan[:, :k], atol=1e-8)


def test_soft_topk_ot_follows_the_authors_semantics_batch_maximum_as_a_constant():
    """Forward: the cost divided by the batch's largest entry (rows depend on each other; ``row`` keeps
    them apart). Gradient: that divisor is a constant, as the authors' ``C / C.max().detach()`` —
    checked against central differences of the plain Sinkhorn with the divisor held at its value."""
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(3, 6)) * np.array([[1.0], [3.0], [0.5]])
    k, epsilon, n = 2, 0.3, 6
    divisor = max(((-r[:, None] - np.array([0.0, 1.0])) ** 2).max() for r in rows)
    operator = SoftTopKOT(epsilon=epsilon, max_iter=3000, tol=0.0)
    scores = torch.tensor(rows, requires_grad=True)
    ours = operator.soft_topk(scores, k)
    expected = np.stack(
        [
            n * soft_ot_by_plain_sinkhorn(-r, [0.0, 1.0], [k / n, (n - k) / n], epsilon, 3000, divisor)[:, 0]
            for r in rows
        ]
    )
    assert np.allclose(ours.detach().numpy(), expected, atol=1e-8)
    per_row = SoftTopKOT(epsilon=epsilon, max_iter=3000, tol=0.0, normalise="row").soft_topk(scores, k)
    assert not np.allclose(per_row.detach().numpy(), expected, atol=1e-3)
    weights = rng.normal(size=(3, 6))
    (ours * torch.tensor(weights)).sum().backward()
    step = 1e-6
    for b, j in ((0, 1), (1, 4), (2, 0)):

        def objective(delta, b=b, j=j):
            shifted = rows[b].copy()
            shifted[j] += delta
            plan = soft_ot_by_plain_sinkhorn(-shifted, [0.0, 1.0], [k / n, (n - k) / n], epsilon, 3000, divisor)
            return float(weights[b] @ (n * plan[:, 0]))

        assert scores.grad[b, j].item() == pytest.approx((objective(step) - objective(-step)) / (2 * step), abs=1e-6)


@pytest.mark.parametrize(
    "operator,output",
    [
        (LapSum(0.7), "soft"),
        (LapSum(0.7), "permutation"),
        (DFTopK(0.5), "soft"),
    ],
)
def test_closed_form_operators_gradcheck_float64(operator, output):
    torch.manual_seed(2)
    scores = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    call = operator.permutation if output == "permutation" else operator.soft_topk
    assert torch.autograd.gradcheck(lambda s: call(s, 3), (scores,))


# SOFT's cost is normalised by its largest entry, so a unit gap between integer scores up to 15 is a
# gap of ~1/100 in cost: ε = 1e-4 is sharp there, and Sinkhorn needs thousands of rounds to get it
@pytest.mark.parametrize(
    "operator,atol", [(LapSum(1e-3), 1e-6), (DFTopK(1e-3), 1e-6), (SoftTopKOT(1e-4, max_iter=5000), 2e-3)]
)
def test_closed_form_operators_are_the_hard_top_k_at_low_temperature(operator, atol):
    scores = torch.randperm(16, generator=torch.Generator().manual_seed(3)).double().reshape(2, 8)
    assert torch.allclose(operator.soft_topk(scores, 3), hard_topk(scores, 3), atol=atol)
    if operator.gives_permutation:
        assert torch.allclose(operator.permutation(scores, 3), hard_permutation(scores, 3), atol=atol)


def test_soft_topk_ot_and_lapsum_sum_to_k_and_dftopk_need_not():
    scores = torch.randn(6, 20, dtype=torch.float64) * 3
    for operator in (LapSum(1.0), SoftTopKOT(0.1)):
        assert torch.allclose(
            operator.soft_topk(scores, 5).sum(1), torch.full((6,), 5.0, dtype=torch.float64), atol=1e-8
        )
    assert not torch.allclose(DFTopK(1.0).soft_topk(scores, 5).sum(1), torch.full((6,), 5.0, dtype=torch.float64))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: LapSum(alpha=0.0), "smaller = sharper"),
        (lambda: DFTopK(temperature=-1.0), "smaller = sharper"),
        (lambda: DFTopK().soft_topk(torch.zeros(1, 4), 4), "k < n"),
        (lambda: SoftTopKOT(epsilon=0.0), "smaller = sharper"),
        (lambda: SoftTopKOT(max_iter=0), "max_iter"),
        (lambda: LapSum().soft_topk(torch.zeros(2, 3), 0), r"k=0 must be an int in \[1, 3\]"),
    ],
)
def test_closed_form_operators_bad_input_is_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()
