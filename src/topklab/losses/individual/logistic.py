from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.individual.base import scores_of


class Logistic(nn.Module):
    """Per-sample logistic loss ``ℓ = log(1 + exp(−y·f(x)))`` for labels y ∈ {−1, +1}
    (STk paper §5.1), computed stably as softplus(−y·f). No reduction.

    Examples
    --------
    >>> Logistic()(torch.tensor([0.0, 2.0]), torch.tensor([1.0, -1.0]))
    tensor([0.6931, 2.1269])
    """

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.softplus(-target.to(output.dtype) * scores_of(output))
