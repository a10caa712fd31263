from __future__ import annotations

import torch
from torch import nn

from topklab.losses.aggregate.base import check_losses


class Maximum(nn.Module):
    """Maximum aggregate loss ``L_max = max_i ℓ_i`` (STk paper §4, "Maximum").

    Examples
    --------
    >>> Maximum()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(6.)
    """

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        return check_losses(losses).max()
