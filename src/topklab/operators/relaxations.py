"""The soft comparators of differentiable sorting networks (Petersen et al., ICML 2021, §3 and
ICLR 2022 "Monotonic Differentiable Sorting Networks"; papers.md §2.3).

Each maps the signed difference v between a wire and its partner to the weight F(v) that the wire
gives its partner's value; ``slope`` gives dF/dv (the networks backpropagate by hand). All are
sigmoids of β·v: increasing, F(0) = 1/2, F(−v) = 1 − F(v); β → ∞ gives the hard swap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch


class Relaxation(NamedTuple):
    weight: Callable  # (v, β, λ, out) -> F(v), written into ``out`` (in place: the networks call it per layer)
    slope: Callable  # (v, F(v), β, λ) -> dF/dv


def logistic_phi_weight(v, b, lam, out):
    """σ(β·v / |v|^λ): the activation replacement trick (ART) sharpens small differences."""
    scale = torch.abs(v, out=out).add_(1e-10)
    scale = scale.rsqrt_() if lam == 0.5 else scale.pow_(-lam)
    return torch.sigmoid(scale.mul_(v).mul_(b), out=out)


def logistic_phi_slope(v, w, b, lam):
    """dF/dv = β·F·(1 − F)·(|v| + ε)^(−λ)·(1 − λ·|v| / (|v| + ε))."""
    scale = v.abs().add_(1e-10)
    shrink = scale.rsqrt() if lam == 0.5 else scale.pow(-lam)
    factor = (scale - 1e-10).mul_(-lam).div_(scale).add_(1.0)
    return torch.mul(w, 1.0 - w).mul_(shrink).mul_(factor).mul_(b)


def optimal_tail(u):
    return torch.where(u.abs() > 0.25, torch.sign(u) * (0.25 - 1.0 / (16.0 * (u.abs() + 1e-10))), torch.zeros_like(u))


RELAXATIONS = {
    "logistic": Relaxation(
        lambda v, b, lam, out: torch.sigmoid(torch.mul(v, b, out=out), out=out), lambda v, w, b, lam: b * w * (1.0 - w)
    ),
    "logistic_phi": Relaxation(logistic_phi_weight, logistic_phi_slope),
    "gaussian": Relaxation(
        lambda v, b, lam, out: torch.erf(torch.mul(v, b / math.sqrt(2.0), out=out), out=out).mul_(0.5).add_(0.5),
        lambda v, w, b, lam: b * torch.exp(-0.5 * (b * v).square()) / math.sqrt(2.0 * math.pi),
    ),
    "reciprocal": Relaxation(
        lambda v, b, lam, out: torch.div(b * v, (b * v).abs_().add_(2.0), out=out).add_(1.0).mul_(0.5),
        lambda v, w, b, lam: b / (2.0 + (b * v).abs()).square(),
    ),
    "cauchy": Relaxation(
        lambda v, b, lam, out: torch.atan(torch.mul(v, b, out=out), out=out).div_(math.pi).add_(0.5),
        lambda v, w, b, lam: b / (math.pi * (1.0 + (b * v).square())),
    ),
    # Petersen et al.'s optimal monotonic sigmoid: linear on |β·v| ≤ 1/4, then 1 − 1/(16|β·v|).
    "optimal": Relaxation(
        lambda v, b, lam, out: out.copy_(torch.clamp(b * v, -0.25, 0.25) + 0.5 + optimal_tail(b * v)),
        lambda v, w, b, lam: (
            b * torch.where((b * v).abs() > 0.25, 1.0 / (16.0 * (b * v).square() + 1e-30), torch.ones_like(v))
        ),
    ),
}


def check_distribution(distribution: str) -> str:
    if distribution not in RELAXATIONS:
        raise ValueError(f"distribution={distribution!r} is unknown; choose one of {', '.join(RELAXATIONS)}")
    return distribution
