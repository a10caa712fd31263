from __future__ import annotations

import torch
from torch import nn

from topklab.losses.aggregate.base import check_losses


class Average(nn.Module):
    """Average aggregate loss ``L_avg = (1/n)·Σ ℓ_i`` (STk paper §4, "Average").

    Examples
    --------
    >>> Average()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(3.)
    """

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        return check_losses(losses).mean()
