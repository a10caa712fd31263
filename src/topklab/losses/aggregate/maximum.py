from __future__ import annotations

import torch

from topklab.losses.aggregate.base import Aggregate


class Maximum(Aggregate):
    """Maximum aggregate loss ``L_max = max_i ℓ_i`` (STk paper §4, "Maximum"). Among tied maxima
    the gradient goes to the one ``torch.max`` returns.

    Parameters
    ----------
    dim : int
        The axis of the losses to take the maximum over (default -1, the last); the other axes are
        rows (see :class:`~topklab.losses.aggregate.base.Aggregate`).

    Examples
    --------
    >>> Maximum()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(6.)
    >>> Maximum(dim=0)(torch.tensor([[1.0, 2.0, 6.0], [0.0, 4.0, 3.0]]))
    tensor([1., 4., 6.])
    """

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        if self.one_row(losses, cpu=False):  # the batched path's value and gradient, without its reshaping
            return losses.max(0).values
        return super().forward(losses)

    def batched(self, losses: torch.Tensor, k, lam, delta) -> torch.Tensor:
        return losses.max(1).values

    def extra_repr(self) -> str:
        return self._dim_repr().removeprefix(", ")
