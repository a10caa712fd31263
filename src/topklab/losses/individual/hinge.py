from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.individual.base import scores_of


class Hinge(nn.Module):
    """Per-sample hinge loss ``ℓ = [1 − y·f(x)]_+`` for labels y ∈ {−1, +1} (STk paper §5.1).
    No reduction.

    Examples
    --------
    >>> Hinge()(torch.tensor([0.5, 2.0]), torch.tensor([1.0, -1.0]))
    tensor([0.5000, 3.0000])
    """

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.relu(1.0 - target.to(output.dtype) * scores_of(output))
