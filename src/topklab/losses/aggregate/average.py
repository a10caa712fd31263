from __future__ import annotations

import torch

from topklab.losses.aggregate.base import Aggregate, mean_without_overflow


class Average(Aggregate):
    """Average aggregate loss ``L_avg = (1/n)·Σ ℓ_i`` (STk paper §4, "Average"). A sum that overflows
    where the mean is finite (float32 losses near 3e38) is redone in float64; ±inf propagate (+inf
    and −inf together give NaN), as does NaN.

    Examples
    --------
    >>> Average()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(3.)
    >>> Average().batched(torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]]), None, None, None)
    tensor([3., 1.])
    """

    def batched(self, losses: torch.Tensor, k, lam, delta) -> torch.Tensor:
        return mean_without_overflow(losses.mean(1), losses, losses.new_full(losses.shape[:1], losses.shape[1]))
