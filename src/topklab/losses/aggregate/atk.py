from __future__ import annotations

import math

import torch

from topklab.losses.aggregate.base import (
    Aggregate,
    accumulation_dtype,
    check_k,
    check_losses,
    mean_without_overflow,
    resolve_count,
)
from topklab.losses.aggregate.kernels import native_if_loaded

ATK_METHODS = ("topk", "sort")


class ATk(Aggregate):
    """Average-top-k aggregate loss, exact: ``L_at-k = (1/k)·Σ_{i<=k} ℓ_[i]`` (STk paper Eq. 4;
    Fan et al. 2017), where ℓ_[1] >= ℓ_[2] >= … are the sorted per-sample losses.

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1). ``k = n`` is
        :class:`Average`, ``k = 1`` is :class:`Maximum`. A tensor gives each row its own k: integer
        counts in [1, n] or floating fractions in (0, 1], of a shape that broadcasts to the losses'
        shape without ``dim``.
    method : {"topk", "sort"}
        ``topk`` selects with ``torch.topk``; ``sort`` sorts all n losses (the paper's "ATk",
        kept for the timing comparisons). Same value and gradient.
    dim : int
        The axis of the losses to aggregate (default -1, the last); the other axes are rows (see
        :class:`~topklab.losses.aggregate.base.Aggregate`).

    Extreme losses: a −inf beyond the k-th does not count; ±inf among the k largest propagate; a
    float32 sum that overflows where the mean is finite is redone in float64 (not for 1-D losses on a
    GPU, whose ``topk().values.mean()`` is returned unchecked: +inf there); NaN propagates. On a CPU, 1-D
    float32/float64 losses with ``method="topk"`` and a number k take one C++ node of the prebuilt
    extension, ``top_mean_row`` of ``thresholded_cpu.cpp``, with ``x.topk(k).values.mean()``'s value and
    gradient bit for bit; without it (never built for this), and where a tracer, a forward-mode tangent,
    a transform of torch.func or a dispatch mode watches the call, that expression itself.

    Examples
    --------
    >>> ATk(k=2)(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    >>> ATk(k=0.5, method="sort")(torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    >>> ATk(k=torch.tensor([1, 3]))(torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 8.0]]))  # a k per row
    tensor([5., 4.])
    >>> ATk(k=1).batched(torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 8.0]]), torch.tensor([2.0, 3.0]), None, None)
    tensor([4., 4.])
    """

    hyperparameters = ("k",)

    def __init__(self, k: int | float | torch.Tensor, method: str = "topk", dim: int = -1):
        super().__init__(dim)
        self.k = check_k(k)
        if method not in ATK_METHODS:
            raise ValueError(f"unknown ATk method {method!r}; choose one of: {', '.join(ATK_METHODS)}")
        self.method = method
        self._counts: dict[tuple[int, type, int | float], int] = {}

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        # the usual case, 1-D losses, is x.topk(k).values.mean() itself, its value and gradient bit for bit: on a
        # CPU as one C++ node where the extension is prebuilt or loaded (with the overflow check), else that
        # expression checked for overflow; on a GPU as it is (a check would synchronise every call)
        if self.one_row(losses, cpu=False) and self.method == "topk" and not isinstance(self.k, torch.Tensor):
            k = self._count(losses.shape[0])
            compiling = torch.compiler.is_compiling()
            native = None if compiling else native_if_loaded()
            value = None if native is None else native.top_mean_row(losses, k)
            if value is not None:
                return value
            value = torch.topk(losses, k).values.mean()  # on a CPU, mean() is sum() / k: the same bits
            if not losses.is_cpu or (not compiling and not math.isinf(value.item())):
                return value
        work = check_losses(losses, self.dim)
        if work.dim() == 1 and not isinstance(self.k, torch.Tensor):
            k = resolve_count(self.k, work.numel())
            ranked = (
                torch.sort(work, descending=True).values[:k] if self.method == "sort" else torch.topk(work, k).values
            )
            value = ranked.sum() / k
            if value.device.type == "cpu" and not torch.compiler.is_compiling() and not math.isinf(value.item()):
                return value.to(losses.dtype)
        return super().forward(losses)

    def _count(self, n: int) -> int:
        """k as a count of n losses (:func:`resolve_count`), kept per (n, k): batches repeat their n."""
        key = (n, type(self.k), self.k)  # 1 and 1.0 are equal keys, but a count and a fraction
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = resolve_count(self.k, n)
        return count

    def batched(self, losses, k, lam, delta):
        """Each row's largest ``k[p]`` losses, ranked (``topk`` up to the largest k, or a full
        ``sort``), masked beyond its own k and averaged; the gradient is 1/k on each of them. Half
        precision losses are summed in float32; the result has the losses' dtype."""
        work, k = losses.to(accumulation_dtype(losses.dtype)), k.to(accumulation_dtype(losses.dtype))
        if self.method == "sort":
            ranked = torch.sort(work, dim=1, descending=True).values
        else:
            ranked = torch.topk(work, int(k.max()), dim=1).values
        keep = torch.arange(ranked.shape[1], device=losses.device)[None, :] < k[:, None]
        kept = torch.where(keep, ranked, torch.zeros_like(ranked))  # a -inf beyond k stays out (0·-inf is NaN)
        return mean_without_overflow(kept.sum(1) / k, kept, k).to(losses.dtype)

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}{self._dim_repr()}"
