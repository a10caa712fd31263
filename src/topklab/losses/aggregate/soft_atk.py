from __future__ import annotations

import torch

from topklab.losses.aggregate.base import Aggregate, accumulation_dtype, check_k, mean_without_overflow
from topklab.operators.base import TopKOperator


class SoftATk(Aggregate):
    """Average-top-k through a differentiable top-k operator: ``(1/k)·Σ_i p_i(ℓ)·ℓ_i`` with
    ``p = operator.soft_topk(ℓ, k)``. With the hard indicator this is :class:`ATk` (STk paper Eq. 4);
    the operator's relaxation spreads the gradient over losses near the k-th largest, and its
    own gradient (through p) is added. A −inf loss with weight 0 contributes nothing (the operators
    weigh one only when fewer than k losses lie above −inf, and then the value is −inf); a float32
    sum that overflows where the mean is finite is redone in float64.

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1). A tensor gives each row
        its own k (integer counts in [1, n] or floating fractions in (0, 1], of a shape that
        broadcasts to the losses' shape without ``dim``); rows sharing a k go through the operator
        together, one call per distinct k.
    operator : TopKOperator
        Any operator of :mod:`topklab.operators` (``configs/operator/``). Its temperature sets how
        far from ATk the aggregate is. (A Python-level aggregate: the tabular protocol's grids and
        tables enumerate ``configs/loss/``, which keeps the paper's five.)
    dim : int
        The axis of the losses to aggregate (default -1, the last); the other axes are rows (see
        :class:`~topklab.losses.aggregate.base.Aggregate`).

    Examples
    --------
    >>> from topklab.operators import DiffSortNet
    >>> SoftATk(k=2, operator=DiffSortNet("odd_even", steepness=100.0, distribution="logistic"))(
    ...     torch.tensor([1.0, 5.0, 3.0, 0.0]))
    tensor(4.)
    """

    hyperparameters = ("k",)

    def __init__(self, k: int | float | torch.Tensor, operator: TopKOperator, dim: int = -1):
        super().__init__(dim)
        if not isinstance(operator, TopKOperator):
            raise ValueError(f"SoftATk needs a top-k operator (configs/operator/), got {type(operator).__name__}")
        self.k = check_k(k)
        self.operator = operator

    def batched(self, losses, k, lam, delta):
        """Each row's soft top-k average at its own k (rows sharing a k go through the operator
        together); half precision losses in float32, the result in the losses' dtype."""
        work = losses.to(accumulation_dtype(losses.dtype))
        values = work.new_empty(work.shape[0])
        for count in torch.unique(k).tolist():
            rows = (k == count).nonzero().squeeze(1)
            chosen = work.index_select(0, rows)
            selected = self.operator.soft_topk(chosen, int(count))
            unweighed = torch.isneginf(chosen) & (selected == 0)  # −inf·0 is NaN; a −inf the operator weighs counts
            weighted = selected * torch.where(unweighed, torch.zeros_like(chosen), chosen)
            row_count = chosen.new_full(rows.shape, float(count))
            values = values.index_copy(0, rows, mean_without_overflow(weighted.sum(1) / count, weighted, row_count))
        return values.to(losses.dtype)

    def extra_repr(self) -> str:
        return f"k={self.k}{self._dim_repr()}"
