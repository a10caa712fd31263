"""The one API of every differentiable top-k operator.

Conventions, the same for every operator:

- ``scores`` is a float tensor of shape (batch, n); a larger score is more likely to be selected.
- ``soft_topk(scores, k)`` returns ``p`` of shape (batch, n): the relaxed indicator of the k
  largest scores, with entries in [0, 1] where the operator is ``bounded``. Its hard limit is 1 on
  the k largest and 0 elsewhere. NeuralSort and SoftSort are not bounded: their relaxed
  permutations are stochastic per rank (each column sums to 1 over the items) but not per item,
  so an item close to several ranks can collect more than 1 (e.g. 1.045 for NeuralSort at τ =
  0.01 on near-equal scores); neither paper clamps it, and neither do we.
- ``permutation(scores, k)`` returns ``P`` of shape (batch, n, k): ``P[b, i, j]`` is the relaxed
  probability that item i is the (j+1)-th largest, so column 0 is the top-1. Its hard limit is the
  one-hot rank of the k largest items. Summing the k columns gives a soft top-k indicator.

Each operator states what it promises through class attributes: ``gives_permutation``,
``sums_to_k`` (Σ p = k exactly), ``bounded`` (0 <= p <= 1; for the Sinkhorn-based operators up to their row-sum tolerance), ``sparse`` (p has exact zeros and ones away from ties) and
``stochastic`` (a Monte-Carlo estimate, seeded).
"""
from __future__ import annotations

import torch
from torch import nn


def check_scores(scores: torch.Tensor, k: int, name: str) -> None:
    """One-line errors for scores that are not (batch, n) floats and for k outside 1..n."""
    if scores.dim() != 2:
        raise ValueError(f"{name} takes scores of shape (batch, n), got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"{name} takes floating-point scores, got {scores.dtype}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= scores.shape[1]:
        raise ValueError(f"{name}: k={k!r} must be an int with 1 <= k <= n={scores.shape[1]}")


def positive(value: float, name: str, direction: str) -> float:
    """``value`` as a float, or a one-line error saying it must be > 0 and which way is sharper."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a number > 0 ({direction})")
    return float(value)


class TopKOperator(nn.Module):
    """Base class: a differentiable relaxation of top-k selection (see the module docstring).

    Subclasses implement :meth:`permutation` (then :meth:`soft_topk` is its column sum) or
    :meth:`soft_topk` alone. Calling the module is :meth:`soft_topk`.
    """

    gives_permutation = False
    sums_to_k = False
    bounded = True      # every entry of p lies in [0, 1] (NeuralSort, SoftSort: False; see the module docstring)
    sparse = False
    stochastic = False

    def soft_topk(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        if not self.gives_permutation:
            raise NotImplementedError(f"{type(self).__name__} must implement soft_topk")
        return self.permutation(scores, k).sum(-1)

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        raise ValueError(f"{type(self).__name__} gives a soft top-k indicator, not a top-k permutation; "
                         "the top-k cross-entropy needs one of the sorting operators (see configs/operator/)")

    def forward(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        return self.soft_topk(scores, k)


def hard_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The exact top-k indicator (ties go to the lower index, as ``torch.topk`` breaks them)."""
    return torch.zeros_like(scores).scatter(1, scores.topk(k, dim=1).indices, 1.0)


def hard_permutation(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The exact top-k permutation: ``P[b, i, j]`` = 1 when item i is the (j+1)-th largest."""
    indices = scores.topk(k, dim=1).indices                         # (batch, k)
    permutation = scores.new_zeros(*scores.shape, k)
    return permutation.scatter(1, indices[:, None, :], 1.0)
