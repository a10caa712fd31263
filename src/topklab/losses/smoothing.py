"""Hinge functions φ used inside the thresholded top-k losses (MATk uses ReLU, STk a smooth one).

Each smoothing gives φ and its slope: ``SMOOTHINGS[name](x, delta)`` applies φ elementwise and
``SMOOTHINGS[name].slope(x, delta, step)`` returns ``step·φ'(x)``, rounded as autograd rounds the
gradient of ``φ`` for an incoming gradient ``step`` (the fused kernels of
:mod:`topklab.losses.aggregate.kernels` compute the gradient in their forward from it). Only SReLU
uses ``delta``; ELU, SoftPlus and Leaky-ReLU run at PyTorch's defaults (alpha=1, beta=1 with
threshold 20, slope 0.01), which is our reading of "the settings for the other ReLU variants
remain at their defaults" (STk paper, Table 2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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

    Examples
    --------
    >>> round(float(srelu(torch.tensor(1.0), 0.01)), 6)
    0.995025
    """
    return 0.5 * (x + torch.sqrt(x * x + delta * delta) - delta)


class Smoothing:
    """φ and its slope. ``delta`` is a tensor broadcastable to ``x`` (ignored unless ``uses_delta``)."""

    name: str = ""
    uses_delta: bool = False
    native_id: int = -1  # its number in thresholded_cpu.cpp

    def __call__(self, x: torch.Tensor, delta) -> torch.Tensor:
        raise NotImplementedError

    def slope(self, x: torch.Tensor, delta, step: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def row_sum(self, x: torch.Tensor, delta, accumulate: torch.dtype) -> torch.Tensor:
        """``Σ_j φ(x_ij)`` per row of ``x`` (P, n), summed in ``accumulate``, returned in x's dtype."""
        return self(x, delta).to(accumulate).sum(1).to(x.dtype)

    def row_sum_and_slope(self, x: torch.Tensor, delta, step: torch.Tensor, accumulate: torch.dtype):
        """:meth:`row_sum` and :meth:`slope` together (a smoothing may share work between them)."""
        return self.row_sum(x, delta, accumulate), self.slope(x, delta, step)

    def __repr__(self) -> str:
        return f"Smoothing({self.name!r})"


class SReLU(Smoothing):
    """Eq. 2; slope ``½(1 + x/√(x²+δ²))·step``, summed as autograd sums the graph of the formula."""

    name, uses_delta, native_id = "srelu", True, 0

    def __call__(self, x, delta):
        return srelu(x, delta)

    def slope(self, x, delta, step):
        return self._slope(x, torch.sqrt(x * x + delta * delta), step)

    def row_sum(self, x, delta, accumulate):
        return self._row_sum(x, delta, torch.sqrt(x * x + delta * delta), accumulate)

    def row_sum_and_slope(self, x, delta, step, accumulate):
        root = torch.sqrt(x * x + delta * delta)
        return self._row_sum(x, delta, root, accumulate), self._slope(x, root, step)

    @staticmethod
    def _row_sum(x, delta, root, accumulate):
        """½·(Σ(x + √(x²+δ²)) − nδ): Eq. 2 summed, with the root the slope uses."""
        return (0.5 * ((x + root).to(accumulate).sum(1) - x.shape[1] * delta[:, 0])).to(x.dtype)

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
        raise ValueError(
            f"unknown smoothing {name!r}; choose one of: {', '.join(sorted(SMOOTHINGS))}"
        ) from None
