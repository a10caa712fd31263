from __future__ import annotations

import math

import torch

from topklab.losses.aggregate.base import Aggregate, check_losses, mean_without_overflow


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

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        # the usual case, a finite CPU mean, is x.mean() itself: a third of the batched path's cost at small n
        plain = check_losses(losses).mean()
        if plain.device.type == "cpu" and not torch.compiler.is_compiling() and not math.isinf(plain.item()):
            return plain
        return super().forward(losses)

    def batched(self, losses: torch.Tensor, k, lam, delta) -> torch.Tensor:
        return mean_without_overflow(losses.mean(1), losses, losses.new_full(losses.shape[:1], losses.shape[1]))
