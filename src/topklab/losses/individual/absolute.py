from __future__ import annotations

import torch
from torch import nn

from topklab.losses.individual.base import scores_of


class Absolute(nn.Module):
    """Per-sample absolute loss ``ℓ = |f(x) − y|`` for regression (STk paper §5.3). No reduction.

    Examples
    --------
    >>> Absolute()(torch.tensor([0.5, 2.0]), torch.tensor([1.0, -1.0]))
    tensor([0.5000, 3.0000])
    """

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (scores_of(output) - target.to(output.dtype)).abs()
