"""The soft comparators of differentiable sorting networks (Petersen et al., ICML 2021, §3 and
ICLR 2022 "Monotonic Differentiable Sorting Networks"; papers.md §2.3).

Each maps the signed difference v between a wire and its partner to the weight F(v) that the wire
gives its partner's value; ``slope`` gives dF/dv (the networks backpropagate by hand). All are
sigmoids of β·v: increasing, F(0) = 1/2, F(−v) = 1 − F(v); β → ∞ gives the hard swap.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch


class Relaxation(NamedTuple):
    weight: Callable  # (v, β, λ) -> F(v)
    slope: Callable   # (v, F(v), β, λ) -> dF/dv


def art_scale(v, art_lambda):
    return (v.abs() + 1e-10).pow(-art_lambda)


def optimal_tail(u):
    return torch.where(u.abs() > 0.25, torch.sign(u) * (0.25 - 1.0 / (16.0 * (u.abs() + 1e-10))), torch.zeros_like(u))


RELAXATIONS = {
    "logistic": Relaxation(
        lambda v, b, lam: torch.sigmoid(b * v),
        lambda v, w, b, lam: b * w * (1.0 - w)),
    # σ(β·v / |v|^λ): the activation replacement trick (ART) sharpens small differences.
    "logistic_phi": Relaxation(
        lambda v, b, lam: torch.sigmoid(b * v * art_scale(v, lam)),
        lambda v, w, b, lam: b * w * (1.0 - w) * art_scale(v, lam) * (1.0 - lam * v.abs() / (v.abs() + 1e-10))),
    "gaussian": Relaxation(
        lambda v, b, lam: 0.5 + 0.5 * torch.erf(b * v / math.sqrt(2.0)),
        lambda v, w, b, lam: b * torch.exp(-0.5 * (b * v).square()) / math.sqrt(2.0 * math.pi)),
    "reciprocal": Relaxation(
        lambda v, b, lam: 0.5 * (b * v / (2.0 + (b * v).abs()) + 1.0),
        lambda v, w, b, lam: b / (2.0 + (b * v).abs()).square()),
    "cauchy": Relaxation(
        lambda v, b, lam: torch.atan(b * v) / math.pi + 0.5,
        lambda v, w, b, lam: b / (math.pi * (1.0 + (b * v).square()))),
    # Petersen et al.'s optimal monotonic sigmoid: linear on |β·v| ≤ 1/4, then 1 − 1/(16|β·v|).
    "optimal": Relaxation(
        lambda v, b, lam: torch.clamp(b * v, -0.25, 0.25) + 0.5 + optimal_tail(b * v),
        lambda v, w, b, lam: b * torch.where((b * v).abs() > 0.25, 1.0 / (16.0 * (b * v).square() + 1e-30),
                                             torch.ones_like(v))),
}


def check_distribution(distribution: str) -> str:
    if distribution not in RELAXATIONS:
        raise ValueError(f"distribution={distribution!r} is unknown; choose one of {', '.join(RELAXATIONS)}")
    return distribution
