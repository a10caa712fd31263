from __future__ import annotations

import math

import torch

from topklab.losses.aggregate.base import Aggregate, check_losses, mean_without_overflow
from topklab.losses.k import resolve_k, validate_k

ATK_METHODS = ("topk", "sort")


class ATk(Aggregate):
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

    Extreme losses: a −inf beyond the k-th does not count; ±inf among the k largest propagate; a
    float32 sum that overflows where the mean is finite is redone in float64; NaN propagates.

    Examples
    --------
    >>> ATk(k=2)(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    >>> ATk(k=0.5, method="sort")(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    >>> ATk(k=1).batched(torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 8.0]]), torch.tensor([2.0, 3.0]), None, None)
    tensor([4., 4.])
    """

    hyperparameters = ("k",)

    def __init__(self, k: int | float, method: str = "topk"):
        super().__init__()
        self.k = validate_k(k)
        if method not in ATK_METHODS:
            raise ValueError(f"unknown ATk method {method!r}; choose one of: {', '.join(ATK_METHODS)}")
        self.method = method

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        # the usual case, a finite CPU value, without the batched path's masks: its value and gradient bit for bit
        k = resolve_k(self.k, check_losses(losses).numel())
        ranked = (
            torch.sort(losses, descending=True).values[:k] if self.method == "sort" else torch.topk(losses, k).values
        )
        value = ranked.sum() / k
        if value.device.type == "cpu" and not torch.compiler.is_compiling() and not math.isinf(value.item()):
            return value
        return super().forward(losses)

    def batched(self, losses, k, lam, delta):
        """Each row's largest ``k[p]`` losses, ranked (``topk`` up to the largest k, or a full
        ``sort``), masked beyond its own k and averaged; the gradient is 1/k on each of them."""
        if self.method == "sort":
            ranked = torch.sort(losses, dim=1, descending=True).values
        else:
            ranked = torch.topk(losses, int(k.max()), dim=1).values
        keep = torch.arange(ranked.shape[1], device=losses.device)[None, :] < k[:, None]
        kept = torch.where(keep, ranked, torch.zeros_like(ranked))  # a -inf beyond k stays out (0·-inf is NaN)
        return mean_without_overflow(kept.sum(1) / k, kept, k)

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}"
