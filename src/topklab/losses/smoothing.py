"""Hinge functions φ used inside the thresholded top-k losses (MATk uses ReLU, STk a smooth one).

``SMOOTHINGS[name](x, delta)`` applies φ elementwise. Only SReLU uses ``delta``; ELU, SoftPlus and
Leaky-ReLU run at PyTorch's defaults (alpha=1, beta=1, slope=0.01), which is our reading of
"the settings for the other ReLU variants remain at their defaults" (STk paper, Table 2).
"""
from __future__ import annotations

from typing import Callable

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


def _relu(x: torch.Tensor, delta: float) -> torch.Tensor:
    return F.relu(x)


def _elu(x: torch.Tensor, delta: float) -> torch.Tensor:
    return F.elu(x)


def _softplus(x: torch.Tensor, delta: float) -> torch.Tensor:
    return F.softplus(x)


def _leaky_relu(x: torch.Tensor, delta: float) -> torch.Tensor:
    return F.leaky_relu(x)


SMOOTHINGS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "srelu": srelu,
    "relu": _relu,
    "elu": _elu,
    "softplus": _softplus,
    "leaky_relu": _leaky_relu,
}


def get_smoothing(name: str) -> Callable[[torch.Tensor, float], torch.Tensor]:
    try:
        return SMOOTHINGS[name]
    except KeyError:
        raise ValueError(
            f"unknown smoothing {name!r}; choose one of: {', '.join(sorted(SMOOTHINGS))}"
        ) from None
