from __future__ import annotations

import torch

from topklab.losses.aggregate.base import Aggregate, check_losses


class Maximum(Aggregate):
    """Maximum aggregate loss ``L_max = max_i ℓ_i`` (STk paper §4, "Maximum"). Among tied maxima
    the gradient goes to the one ``torch.max`` returns.

    Examples
    --------
    >>> Maximum()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(6.)
    >>> Maximum().batched(torch.tensor([[1.0, 2.0, 6.0], [0.0, 4.0, 3.0]]), None, None, None)
    tensor([6., 4.])
    """

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        return check_losses(losses).max(0).values  # the batched path's value and gradient, without its reshaping

    def batched(self, losses: torch.Tensor, k, lam, delta) -> torch.Tensor:
        return losses.max(1).values
