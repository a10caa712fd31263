from __future__ import annotations

import torch
from torch import nn

from topklab.losses.individual.base import scores_of


class Square(nn.Module):
    """Per-sample squared loss ``ℓ = (f(x) − y)²`` for regression (STk paper §5.3). No reduction.

    Examples
    --------
    >>> Square()(torch.tensor([0.5, 2.0]), torch.tensor([1.0, -1.0]))
    tensor([0.2500, 9.0000])
    """

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (scores_of(output) - target.to(output.dtype)).square()
