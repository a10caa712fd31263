"""Hinge functions φ used inside the thresholded top-k losses (MATk uses ReLU, STk a smooth one), and
SReLU's slope and curvature, which the losses' λ solve and the STk-threshold operator share (so this
module sits below both ``topklab.operators`` and ``topklab.losses``).

Each smoothing gives φ and its slope: ``SMOOTHINGS[name](x, delta)`` applies φ elementwise and
``SMOOTHINGS[name].slope(x, delta, step)`` returns ``step·φ'(x)``, rounded as autograd rounds the
gradient of ``φ`` for an incoming gradient ``step`` (the fused kernels of
:mod:`topklab.losses.aggregate.kernels` compute the gradient in their forward from it). Only SReLU
uses ``delta``; ELU, SoftPlus and Leaky-ReLU run at PyTorch's defaults (alpha=1, beta=1 with
threshold 20, slope 0.01), which is our reading of "the settings for the other ReLU variants
remain at their defaults" (STk paper, Table 2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_BEYOND_SQUARE = {
    dtype: 2.0 ** (math.frexp(torch.finfo(dtype).max)[1] // 2 - 1)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


def beyond_square(dtype: torch.dtype) -> float:
    """The |x| from which SReLU's √(x² + δ²) is taken as |x|: a power of two whose square (plus δ², for
    any δ up to :data:`~topklab.losses.aggregate.thresholded.MAX_DELTA`) stays finite in ``dtype``,
    and against which δ²/x² is below the dtype's rounding (2^63 in float32 and bfloat16, 2^511 in
    float64, 2^7 in float16).

    Examples
    --------
    >>> beyond_square(torch.float32) == 2.0 ** 63, beyond_square(torch.float64) == 2.0 ** 511
    (True, True)
    """
    return _BEYOND_SQUARE[dtype]  # a table, not functools.cache, which torch.compile would warn about


def srelu_root(x: torch.Tensor, delta) -> torch.Tensor:
    """``√(x² + δ²)``, and ``|x|`` from :func:`beyond_square` on (where x² would overflow, and δ is
    below rounding against x)."""
    size = x.abs()
    return torch.where(size < beyond_square(x.dtype), torch.sqrt(x * x + delta * delta), size)


def mean_terms(terms: torch.Tensor) -> torch.Tensor:
    """``(1/n)·Σ_j terms_ij`` per row (P, n) -> (P,) in the terms' dtype: each term divided by n in
    float64 and summed there (a sum of finite terms overflows only where the mean does)."""
    return (terms.to(torch.float64) * (1.0 / terms.shape[1])).sum(1).to(terms.dtype)


def srelu(x: torch.Tensor, delta: float = 0.01) -> torch.Tensor:
    """Smoothed ReLU, STk paper Eq. 2.

    ``SReLU(x) = ½·[x + δ·(√(x²/δ² + 1) − 1)] = ½·(x + √(x² + δ²) − δ)``

    Parameters
    ----------
    x : Tensor
        Any shape.
    delta : float, > 0
        Smoothing width. Smaller is sharper: SReLU → ReLU uniformly as δ → 0, with
        ``0 <= ReLU(x) − SReLU(x) < δ/2`` everywhere (Proposition 1).

    Extreme inputs: SReLU(+inf) = +inf, SReLU(−inf) = −δ/2 (its limit; x is clamped at
    −:func:`beyond_square`), and no finite x overflows (the root is |x| where x² would; the
    halves are added, so x near the dtype's maximum stays finite). NaN gives NaN.

    Examples
    --------
    >>> round(float(srelu(torch.tensor(1.0), 0.01)), 6)
    0.995025
    >>> srelu(torch.tensor([float("-inf"), 3e38, float("inf")]), 0.01)
    tensor([-5.0000e-03,  3.0000e+38,         inf])
    """
    clamped = x.clamp(min=-beyond_square(x.dtype))
    return 0.5 * srelu_root(clamped, delta) + 0.5 * clamped - 0.5 * delta  # this order: autograd sums as the slope


def srelu_slope_and_curvature(z: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(SReLU'(z), SReLU''(z))`` elementwise: ``½(1 + z/r)`` and ``½δ²/r³`` with ``r = √(z² + δ²)``.
    The slope is computed as ``δ²/(2r(r − z))`` for z < 0, which keeps its relative accuracy in the
    tail where ``1 + z/r`` cancels. Beyond ±:func:`beyond_square` (±inf
    included) z is clamped there: slope 1 or 0, curvature 0."""
    big = beyond_square(z.dtype)
    z = z.clamp(-big, big)
    root = srelu_root(z, delta)
    negative = z.clamp(max=0.0)
    tail = delta * delta / (2.0 * root * (root - negative))
    slope = torch.where(z < 0, tail, 0.5 * (1.0 + z / root))
    return slope, 0.5 * delta * delta / root**3


class Smoothing:
    """φ and its slope. ``delta`` is a tensor broadcastable to ``x`` (ignored unless ``uses_delta``)."""

    name: str = ""
    uses_delta: bool = False
    native_id: int = -1  # its number in thresholded_cpu.cpp

    def __call__(self, x: torch.Tensor, delta) -> torch.Tensor:
        raise NotImplementedError

    def slope(self, x: torch.Tensor, delta, step: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def row_mean(self, x: torch.Tensor, delta) -> torch.Tensor:
        """``(1/n)·Σ_j φ(x_ij)`` per row of ``x`` (P, n) in x's dtype, summed in float64 with each term
        divided by n first, so that no sum of finite terms overflows where the mean is finite."""
        return mean_terms(self(x, delta))

    def row_mean_and_slope(self, x: torch.Tensor, delta, step: torch.Tensor):
        """:meth:`row_mean` and :meth:`slope` together (a smoothing may share work between them)."""
        return self.row_mean(x, delta), self.slope(x, delta, step)

    def __repr__(self) -> str:
        return f"Smoothing({self.name!r})"


class SReLU(Smoothing):
    """Eq. 2 as :func:`srelu` computes it; slope ``½(1 + x/√(x²+δ²))·step``, summed as autograd sums
    the graph of :func:`srelu` (bit for bit below :func:`beyond_square`; beyond it, the slope at
    ±:func:`beyond_square`, step or 0 to rounding). The same selects as the C++ kernel: the slope
    and its root are taken at x clamped to ±:func:`beyond_square`, and φ's root is the larger of
    that root and |x| (which for ordinary x is that root)."""

    name, uses_delta, native_id = "srelu", True, 0

    def __call__(self, x, delta):
        return srelu(x, delta)

    def slope(self, x, delta, step):
        bounded, bounded_root = self._bounded(x, delta)
        return self._slope(bounded, bounded_root, step)

    def row_mean(self, x, delta):
        return self.row_mean_and_slope(x, delta, None)[0]

    def row_mean_and_slope(self, x, delta, step):
        big = beyond_square(x.dtype)
        low = x.clamp(min=-big)
        bounded, bounded_root = self._bounded(x, delta)
        root = torch.maximum(bounded_root, low.abs())
        hinge = mean_terms(0.5 * low + 0.5 * root) - 0.5 * delta[:, 0]
        return hinge, None if step is None else self._slope(bounded, bounded_root, step)

    @staticmethod
    def _bounded(x, delta):
        big = beyond_square(x.dtype)
        bounded = x.clamp(-big, big)
        return bounded, torch.sqrt(bounded * bounded + delta * delta)

    @staticmethod
    def _slope(x, root, step):
        half = step * 0.5
        vx = (half / (2 * root)) * x
        return half + vx + vx


class ReLU(Smoothing):
    """``[x]_+`` (MATk); slope ``step`` where x > 0, else 0."""

    name, native_id = "relu", 1

    def __call__(self, x, delta):
        return F.relu(x)

    def slope(self, x, delta, step):
        return torch.where(x > 0, step, torch.zeros_like(x))


class ELU(Smoothing):
    """ELU with alpha = 1; slope ``step`` where x > 0, else ``step·eˣ`` (ATen's own ``elu_backward``,
    whose exponential rounds differently from ``torch.exp``)."""

    name, native_id = "elu", 2

    def __call__(self, x, delta):
        return F.elu(x)

    def slope(self, x, delta, step):
        return torch.ops.aten.elu_backward(step.expand_as(x).contiguous(), 1.0, 1.0, 1.0, False, x)


class Softplus(Smoothing):
    """``log(1 + eˣ)`` (beta 1, linear above x = 20); slope ``step·eˣ/(eˣ + 1)`` (ATen's own
    ``softplus_backward``)."""

    name, native_id = "softplus", 3

    def __call__(self, x, delta):
        return F.softplus(x)

    def slope(self, x, delta, step):
        return torch.ops.aten.softplus_backward(step.expand_as(x).contiguous(), x, 1.0, 20.0)


class LeakyReLU(Smoothing):
    """Leaky ReLU with slope 0.01; slope ``step`` where x > 0, else ``0.01·step``."""

    name, native_id = "leaky_relu", 4

    def __call__(self, x, delta):
        return F.leaky_relu(x)

    def slope(self, x, delta, step):
        return torch.where(x > 0, step, step * 0.01)


SMOOTHINGS: dict[str, Smoothing] = {s.name: s for s in (SReLU(), ReLU(), ELU(), Softplus(), LeakyReLU())}


def get_smoothing(name: str) -> Smoothing:
    """The smoothing called ``name``.

    Examples
    --------
    >>> x = torch.tensor([-1.0, 0.5])
    >>> get_smoothing("relu")(x, None), get_smoothing("relu").slope(x, None, torch.tensor(2.0))
    (tensor([0.0000, 0.5000]), tensor([0., 2.]))
    """
    try:
        return SMOOTHINGS[name]
    except KeyError:
        raise ValueError(f"unknown smoothing {name!r}; choose one of: {', '.join(sorted(SMOOTHINGS))}") from None
