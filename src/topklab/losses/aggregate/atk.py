from __future__ import annotations

import torch
from torch import nn

from topklab.losses.aggregate.base import check_losses
from topklab.losses.k import resolve_k, validate_k

ATK_METHODS = ("topk", "sort")


class ATk(nn.Module):
    """Average-top-k aggregate loss, exact: ``L_at-k = (1/k)·Σ_{i<=k} ℓ_[i]`` (STk paper Eq. 4;
    Fan et al. 2017), where ℓ_[1] >= ℓ_[2] >= … are the sorted per-sample losses.

    Parameters
    ----------
    k : int >= 1 or float in (0, 1]
        A count, or a fraction of the batch (rounded half-up, at least 1). ``k = n`` is
        :class:`Average`, ``k = 1`` is :class:`Maximum`.
    method : {"topk", "sort"}
        ``topk`` selects with ``torch.topk``; ``sort`` sorts all n losses (the paper's "ATk",
        kept for the timing comparisons). Same value and gradient.

    Examples
    --------
    >>> ATk(k=2)(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    >>> ATk(k=0.5, method="sort")(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    """

    def __init__(self, k: int | float, method: str = "topk"):
        super().__init__()
        self.k = validate_k(k)
        if method not in ATK_METHODS:
            raise ValueError(f"unknown ATk method {method!r}; choose one of: {', '.join(ATK_METHODS)}")
        self.method = method

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        losses = check_losses(losses)
        k = resolve_k(self.k, losses.numel())
        if self.method == "sort":
            largest = torch.sort(losses, descending=True).values[:k]
        else:
            largest = torch.topk(losses, k, sorted=False).values
        return largest.mean()

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}"
