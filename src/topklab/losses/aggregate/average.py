from __future__ import annotations

import torch

from topklab.losses.aggregate.base import Aggregate


class Average(Aggregate):
    """Average aggregate loss ``L_avg = (1/n)·Σ ℓ_i`` (STk paper §4, "Average").

    Examples
    --------
    >>> Average()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(3.)
    >>> Average().batched(torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]]), None, None, None)
    tensor([3., 1.])
    """

    def batched(self, losses, k, lam, delta):
        return losses.mean(1)
