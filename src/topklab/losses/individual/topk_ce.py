"""Top-k cross-entropy with a distribution P_K over k (Petersen et al., ICML 2022), per sample.

Any operator of :mod:`topklab.operators` that gives a relaxed top-k permutation supplies, for every
class, the probability of sitting at each of the top K ranks; the loss is the negative log of the
P_K-weighted probability that the true class is among the top k. Unlike
``difftopk.TopKCrossEntropyLoss`` the loss is not averaged, so any aggregate (Average, ATk, STk) can
reduce it; its batch mean equals difftopk's loss (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.pk import validate_p_k
from topklab.operators.base import TopKOperator

TOP1_MODES = ("sm", "smce", "sort")


def select_top_m(output: torch.Tensor, target: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The true class's score first, then the m−1 largest other scores (a hard pre-selection)."""
    batch, classes = output.shape
    others = output.masked_fill(F.one_hot(target, classes).bool(), float("-inf"))
    top_others = others.topk(m - 1, dim=1).values
    true = output.gather(1, target[:, None])
    return torch.cat([true, top_others], dim=1), torch.zeros_like(target)


class TopKCrossEntropy(nn.Module):
    """Per-sample top-k cross-entropy with a distribution P_K over k.

    Parameters
    ----------
    p_k : list of K probabilities, K <= classes (e.g. [.2, .2, .2, .2, .2]; [1] is softmax CE)
    operator : TopKOperator that gives a permutation (``configs/operator/``: odd_even, bitonic,
        splitter_selection, neuralsort, softsort, sinkhorn, lapsum, soft_topk_ot, perturbed,
        difftopk_network). Its temperature is its own field (e.g. a network's steepness β).
    m : int or None, hard pre-selection of the true class plus the top m−1 others (needs K < m < classes)
    top1_mode : sm | smce | sort
        How the k = 1 term is computed: softmax probability (sm, the library default), a separate
        softmax cross-entropy term (smce, difftopk's CIFAR-100 script) or the sorter (sort).
    num_classes : int, filled in from the dataset

    Examples
    --------
    >>> from topklab.operators import NeuralSort
    >>> loss = TopKCrossEntropy(p_k=[0.5, 0.5], operator=NeuralSort(tau=0.0625), num_classes=4)
    >>> loss(torch.tensor([[3.0, 2.0, 0.0, -1.0]]), torch.tensor([1])).shape
    torch.Size([1])

    References
    ----------
    Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022, Eq. 3 (papers.md §2.1).
    """

    def __init__(
        self, p_k, operator: TopKOperator, m: int | None = None, top1_mode: str = "sm", num_classes: int | None = None
    ):
        super().__init__()
        if num_classes is None:
            raise ValueError("TopKCrossEntropy needs num_classes; use it with a classification dataset")
        self.p_k = validate_p_k(list(p_k), num_classes)
        if not isinstance(operator, TopKOperator) or not operator.gives_permutation:
            raise ValueError(
                f"TopKCrossEntropy needs an operator that gives a top-k permutation, got "
                f"{type(operator).__name__}; choose a sorting operator (configs/operator/)"
            )
        if top1_mode not in TOP1_MODES:
            raise ValueError(f"top1_mode={top1_mode!r}; choose one of {', '.join(TOP1_MODES)}")
        self.k = len(self.p_k)
        if m is not None and not self.k < m < num_classes:
            raise ValueError(f"m={m} must satisfy K={self.k} < m < classes={num_classes} (or be null)")
        self.operator, self.m, self.top1_mode, self.num_classes = operator, m, top1_mode, num_classes

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.long()
        if self.m is not None:
            output, target = select_top_m(output, target, self.m)
        rows = torch.arange(len(target), device=output.device)
        p_topk = self.operator.permutation(output, self.k)
        within_top = p_topk.cumsum(-1)[rows, target]  # (B, K): P(true class among the top j+1)
        weights = torch.tensor(self.p_k, dtype=within_top.dtype, device=output.device)
        if self.top1_mode == "sort":
            return -torch.log((within_top * weights).sum(-1) * (1 - 2e-7) + 1e-7)
        rest = (within_top[:, 1:] * weights[1:]).sum(-1)
        if self.top1_mode == "sm":
            top1 = torch.softmax(output, dim=-1)[rows, target]
            return -torch.log((self.p_k[0] * top1 + rest) * (1 - 2e-7) + 1e-7)
        ce = F.cross_entropy(output, target, reduction="none")
        return self.p_k[0] * ce + sum(self.p_k[1:]) * -torch.log(rest * (1 - 2e-7) + 1e-7)
