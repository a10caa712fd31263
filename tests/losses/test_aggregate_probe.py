"""Every aggregate on extreme losses: a table of inputs — ordinary, negative, huge
(squares overflow), near the dtype's maximum (sums overflow), tiny, ±inf alone and together, more
+inf than k, fewer finite losses than k, ties, NaN, n = 1 — run through each aggregate and kernel in
float32 and float64, against a 60-digit mpmath reference of the aggregate's formula at the λ the
module used. A finite reference must come back finite and close, ±inf as the same infinity, NaN as
NaN; where the value is finite the gradient is finite too, and a −inf loss gets none of it."""

import math

import pytest
import torch
from mpmath import mp, mpf

from topklab.losses import ATk, Average, MATk, Maximum, SoftATk, STk
from topklab.operators import LapSum

mp.dps = 60
INF, NAN = float("inf"), float("nan")
K = 2
ORDINARY = [0.3, 1.2, 2.5, 0.9, 4.1, 0.05]


def cases(dtype):
    top = torch.finfo(dtype).max
    huge = 1e30 if dtype == torch.float32 else 1e160  # beyond √max: x² overflows
    return {
        "ordinary": ORDINARY,
        "negative": [-3.0, -1.5, 0.2, -0.7, 1.1, -2.2],
        "huge": [v * huge for v in ORDINARY],
        "near_max": [0.9 * top, 0.8 * top, 0.1, 0.2, 0.3, 0.7 * top],  # the sum overflows, the mean does not
        "tiny": [v * 1e-30 for v in ORDINARY],
        "plus_inf": [0.3, INF, 2.5, 0.9, 4.1, 0.05],
        "minus_inf": [0.3, 1.2, -INF, 0.9, 4.1, 0.05],
        "both_inf": [INF, 1.2, -INF, 0.9, 4.1, 0.05],
        "more_plus_inf_than_k": [INF, INF, INF, 0.9, 0.2, 0.1],
        "fewer_finite_than_k": [-INF, -INF, -INF, -INF, -INF, 1.0],
        "ties": [1.0] * 6,
        "nan": [0.3, NAN, 2.5, 0.9, 4.1, 0.05],
        "single": [2.0],  # with k = 1
    }


def srelu_reference(x: mpf, delta: mpf) -> mpf:
    """Eq. 2 in exact arithmetic, its limits at ±inf, and the rationalised tail for x < 0."""
    if mp.isnan(x):
        return mpf("nan")
    if mp.isinf(x):
        return x if x > 0 else -delta / 2
    root = mp.sqrt(x * x + delta * delta)
    return (x + root - delta) / 2 if x >= 0 else (delta * delta / (root - x) - delta) / 2


def srelu_slope_reference(x: mpf, delta: mpf) -> mpf:
    if mp.isinf(x):
        return mpf(1) if x > 0 else mpf(0)
    return (1 + x / mp.sqrt(x * x + delta * delta)) / 2


def relu_reference(x, delta):
    return x if x > 0 else mpf(0)


def relu_slope_reference(x, delta):
    return mpf(1) if x > 0 else mpf(0)


def mean(values):
    return mp.fsum(values) / len(values) if not any(mp.isnan(v) for v in values) else mpf("nan")


def top_k(values, k):
    if any(mp.isnan(v) for v in values):
        return mpf("nan")
    return mean(sorted(values, reverse=True)[:k])


class Thresholded:
    """MATk/STk at the λ the module used: s·[(1/n)·Σ φ(ℓ − λ) + (k/n)·λ]."""

    def __init__(self, phi, slope, delta, scale):
        self.phi, self.slope, self.delta, self.scale = phi, slope, mpf(delta), scale

    def value(self, values, k, lam):
        n = len(values)
        if any(mp.isnan(v) for v in values):
            return mpf("nan")
        hinge = mp.fsum(self.phi(v - lam, self.delta) for v in values) / n
        return (hinge + mpf(k) / n * lam) * (mpf(n) / k if self.scale == "atk" else 1)

    def gradient(self, values, k, lam):
        n = len(values)
        factor = (mpf(n) / k if self.scale == "atk" else 1) / n
        return [self.slope(v - lam, self.delta) * factor for v in values]


SRELU = Thresholded(srelu_reference, srelu_slope_reference, 0.01, "paper")
AGGREGATES = {
    "average": (lambda k: Average(), lambda v, k, lam: mean(v)),
    "maximum": (lambda k: Maximum(), lambda v, k, lam: max(v) if not any(mp.isnan(x) for x in v) else mpf("nan")),
    "atk_topk": (lambda k: ATk(k=k), lambda v, k, lam: top_k(v, k)),
    "atk_sort": (lambda k: ATk(k=k, method="sort"), lambda v, k, lam: top_k(v, k)),
    "stk_solve_eager": (lambda k: STk(k=k, kernel="eager"), SRELU.value),
    "stk_solve_native": (lambda k: STk(k=k, kernel="native"), SRELU.value),
    "stk_gradient_native": (lambda k: STk(k=k, kernel="native", lam_update="gradient", lam_init=1.0), SRELU.value),
    "stk_atk_scale": (
        lambda k: STk(k=k, kernel="eager", scale="atk"),
        Thresholded(srelu_reference, srelu_slope_reference, 0.01, "atk").value,
    ),
    "matk_solve": (
        lambda k: MATk(k=k, kernel="eager"),
        Thresholded(relu_reference, relu_slope_reference, 0, "paper").value,
    ),
    "matk_gradient_native": (
        lambda k: MATk(k=k, kernel="native", lam_update="gradient", lam_init=1.0),
        Thresholded(relu_reference, relu_slope_reference, 0, "paper").value,
    ),
}


def soft_atk_reference(values, k, lam):
    """(1/k)·Σ p_i·ℓ_i with p from LapSum in float64 (the operator's own probe checks p); a −inf loss has p = 0."""
    if any(mp.isnan(v) for v in values):
        return mpf("nan")
    weights = LapSum(alpha=0.5).soft_topk(torch.tensor([[float(v) for v in values]], dtype=torch.float64), k)[0]
    return mp.fsum(mpf(p) * v for p, v in zip(weights.tolist(), values) if p != 0) / k


AGGREGATES["soft_atk_lapsum"] = (lambda k: SoftATk(k=k, operator=LapSum(alpha=0.5)), soft_atk_reference)
GRADIENTS = {"stk_solve_eager": SRELU, "stk_solve_native": SRELU, "stk_gradient_native": SRELU}


def used_lambda(module) -> float | None:
    """The λ the last call used: the solve's root (training) or the trained parameter."""
    if not getattr(module, "has_threshold", False):
        return None
    return float(module.lam_last if module.lam_update == "solve" else module.threshold)


def tolerance(dtype, values):
    scale = max([abs(v) for v in values if math.isfinite(v)] + [1e-300])
    eps = torch.finfo(dtype).eps
    return 64 * eps, 64 * eps * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(cases(torch.float32)))
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_every_aggregate_returns_the_reference_value_on_extreme_losses(name, case, dtype):
    build, reference = AGGREGATES[name]
    values = cases(dtype)[case]
    k = min(K, len(values))
    module = build(k).to(dtype)  # λ's buffers in the losses' dtype, as a model.double() would have them
    losses = torch.tensor(values, dtype=dtype, requires_grad=True)
    value = module(losses)
    lam = used_lambda(module)
    exact = [mpf(v) for v in torch.tensor(values, dtype=dtype).tolist()]  # the inputs as the dtype holds them
    want = reference(exact, k, None if lam is None else mpf(lam))
    got = float(value)
    if mp.isnan(want):
        assert math.isnan(got), f"{name} on {case}: {got}, the reference is NaN"
        return
    if mp.isinf(want):
        assert got == float(want), f"{name} on {case}: {got}, the reference is {want}"
    else:
        rtol, atol = tolerance(dtype, values)
        assert math.isfinite(got) and got == pytest.approx(float(want), rel=rtol, abs=atol), (
            f"{name} on {case}: {got}, the reference is {float(want)}"
        )
        if lam is not None:
            assert math.isfinite(lam), f"{name} on {case}: λ = {lam}"
    if not math.isfinite(got):
        return
    (gradient,) = torch.autograd.grad(value, losses)
    assert torch.isfinite(gradient).all(), f"{name} on {case}: gradient {gradient.tolist()}"
    assert (gradient[torch.isneginf(losses.detach())] == 0).all()
    if name in GRADIENTS:
        expected = [float(g) for g in GRADIENTS[name].gradient(exact, k, mpf(lam))]
        torch.testing.assert_close(gradient, torch.tensor(expected, dtype=dtype), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", list(AGGREGATES))
def test_an_aggregate_of_no_losses_is_a_one_line_error(name):
    with pytest.raises(ValueError, match=r"cannot aggregate an empty batch of losses \(n=0\)"):
        AGGREGATES[name][0](K)(torch.zeros(0))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_compiled_kernel_returns_the_reference_value_on_extreme_losses(dtype):
    """The torch.compile path (the GPU's default) on the same table (slow: one compilation per dtype)."""
    for case, values in cases(dtype).items():
        k = min(K, len(values))
        module = STk(k=k, kernel="compiled", lam_update="gradient", lam_init=1.0).to(dtype)
        losses = torch.tensor(values, dtype=dtype, requires_grad=True)
        got = float(module(losses))
        want = SRELU.value([mpf(v) for v in losses.tolist()], k, mpf(float(module.threshold)))
        if mp.isnan(want):
            assert math.isnan(got), case
        elif mp.isinf(want):
            assert got == float(want), case
        else:
            rtol, atol = tolerance(dtype, values)
            assert got == pytest.approx(float(want), rel=rtol, abs=atol), case
