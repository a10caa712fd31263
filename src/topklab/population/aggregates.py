"""Batched aggregate losses: ``losses`` is (P, B), one row per member; per-member k (a count),
λ and δ are (P,) tensors. Each matches its single-model module in topklab.losses row by row."""
from __future__ import annotations

import torch

from topklab.losses.smoothing import get_smoothing, srelu


def average(losses, k, lam, delta):
    return losses.mean(1)


def maximum(losses, k, lam, delta):
    return losses.max(1).values


def atk(losses, k, lam, delta):
    ranked = torch.sort(losses, dim=1, descending=True).values
    keep = torch.arange(losses.shape[1], device=losses.device)[None, :] < k[:, None]
    return (ranked * keep).sum(1) / k


def matk(losses, k, lam, delta):
    return torch.relu(losses - lam[:, None]).mean(1) + k / losses.shape[1] * lam


def stk(losses, k, lam, delta):
    return srelu(losses - lam[:, None], delta[:, None]).mean(1) + k / losses.shape[1] * lam


BATCHED_AGGREGATES = {"average": average, "maximum": maximum, "atk": atk, "matk": matk, "stk": stk}
USES_K = {"atk", "matk", "stk"}
USES_LAMBDA = {"matk", "stk"}
USES_DELTA = {"stk"}


def thresholded(smoothing: str):
    """``(1/B)·Σ φ(ℓ − λ) + (k/B)·λ`` with φ = ``SMOOTHINGS[smoothing]`` (STk with another ReLU
    variant, STk paper Table 2); φ gets δ but only SReLU uses it."""
    phi = get_smoothing(smoothing)

    def aggregate(losses, k, lam, delta):
        return phi(losses - lam[:, None], delta[:, None]).mean(1) + k / losses.shape[1] * lam

    return aggregate
