"""Top-k cross-entropy with a distribution P_K over k (Petersen et al., ICML 2022), per sample.

A differentiable sorting or selection operator gives, for every class, the probability of sitting
at each of the top K ranks; the loss is the negative log of the P_K-weighted probability that the
true class is among the top k. Operators come from difftopk, except SinkhornSort (ours: difftopk
dropped it). Unlike ``difftopk.TopKCrossEntropyLoss`` the loss is not averaged, so any aggregate
(Average, ATk, STk) can reduce it; its batch mean equals difftopk's loss (tested).
"""
from __future__ import annotations

import contextlib
import importlib
import io

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.pk import validate_p_k
from topklab.operators.sinkhorn_sort import SinkhornSort

TOP1_MODES = ("sm", "smce", "sort")
DISTRIBUTIONS = ("logistic", "logistic_phi", "gaussian", "reciprocal", "cauchy", "optimal")
SPARSE_HINT = (
    "needs torch-sparse, which is not installed; build it with `make sparse` (about 11 minutes on 2 cores) "
    "or use bitonic__non_sparse / odd_even"
)


def difftopk_module(name: str = "difftopk"):
    """Import difftopk (or a submodule) without its print about the optional torch-sparse."""
    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module(name)


def sort_operator(sort, rank_columns) -> callable:
    """Wrap a soft sort returning (B, n, n) into ``scores -> P_topk`` of shape (B, n, K)."""
    return lambda scores, k: rank_columns(sort(scores))[:, :, -k:]


def neuralsort(num_inputs, k, settings):
    return sort_operator(difftopk_module().NeuralSort(tau=1.0 / settings["inverse_temperature"]), lambda p: p)


def softsort(num_inputs, k, settings):
    sort = difftopk_module().SoftSort(tau=1.0 / settings["inverse_temperature"])
    return sort_operator(lambda scores: sort(-scores), lambda p: p.transpose(-2, -1))


def sinkhorn(num_inputs, k, settings):
    return sort_operator(SinkhornSort(settings["inverse_temperature"], settings["sinkhorn_iterations"]), lambda p: p)


def network(kind: str, sparse: bool):
    def build(num_inputs, k, settings):
        if sparse and not difftopk_module("difftopk.functional").SPARSE_INSTALLED:
            raise ValueError(f"topk_ce method {settings['method']!r} {SPARSE_HINT}")
        net = difftopk_module().DiffTopkNet(kind, num_inputs, k, sparse=sparse, device=settings["device"],
                          steepness=settings["inverse_temperature"], art_lambda=settings["art_lambda"],
                          distribution=settings["distribution"])
        return lambda scores, k_: net(scores)[1][:, :, -k_:]

    return build


METHODS = {
    "neuralsort": neuralsort,
    "softsort": softsort,
    "sinkhorn": sinkhorn,
    "odd_even": network("odd_even", sparse=False),
    "bitonic__non_sparse": network("bitonic", sparse=False),
    "bitonic": network("bitonic", sparse=True),
    "splitter_selection": network("splitter_selection", sparse=True),
}


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
    method : neuralsort | softsort | sinkhorn | odd_even | bitonic__non_sparse | bitonic | splitter_selection
        bitonic and splitter_selection are difftopk's sparse networks and need torch-sparse.
    inverse_temperature : float > 0
        Steepness β of the relaxation; larger is sharper (closer to a hard sort). NeuralSort,
        SoftSort use τ = 1/β; SinkhornSort ε = 1/β; networks use β in their swap sigmoid.
    distribution : one of logistic, logistic_phi, gaussian, reciprocal, cauchy, optimal
        The swap relaxation of sorting networks (difftopk's default is cauchy, its CIFAR runs
        use logistic_phi). Ignored by the other methods.
    art_lambda : float >= 0, λ of the activation-replacement trick (logistic_phi only; library 0.25, scripts 0.5)
    m : int or None, hard pre-selection of the true class plus the top m−1 others (needs K < m < classes)
    top1_mode : sm | smce | sort
        How the k = 1 term is computed: softmax probability (sm, the library default), a separate
        softmax cross-entropy term (smce, difftopk's CIFAR-100 script) or the sorter (sort).
    num_classes : int, filled in from the dataset
    sinkhorn_iterations : int >= 1 (sinkhorn only)

    Examples
    --------
    >>> loss = TopKCrossEntropy(p_k=[0.5, 0.5], method="neuralsort", inverse_temperature=16.0, num_classes=4)
    >>> loss(torch.tensor([[3.0, 2.0, 0.0, -1.0]]), torch.tensor([1])).shape
    torch.Size([1])

    References
    ----------
    Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022, Eq. 3 (papers.md §2.1).
    """

    def __init__(self, p_k, method: str = "neuralsort", inverse_temperature: float = 1.0,
                 distribution: str = "cauchy", art_lambda: float = 0.25, m: int | None = None,
                 top1_mode: str = "sm", num_classes: int | None = None, sinkhorn_iterations: int = 50):
        super().__init__()
        if num_classes is None:
            raise ValueError("TopKCrossEntropy needs num_classes; use it with a classification dataset")
        self.p_k = validate_p_k(list(p_k), num_classes)
        if method not in METHODS:
            raise ValueError(f"topk_ce method {method!r} is unknown; choose one of {', '.join(METHODS)}")
        if top1_mode not in TOP1_MODES:
            raise ValueError(f"top1_mode={top1_mode!r}; choose one of {', '.join(TOP1_MODES)}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution={distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")
        if not inverse_temperature > 0:
            raise ValueError(f"inverse_temperature={inverse_temperature} must be > 0 (larger = sharper)")
        if art_lambda < 0:
            raise ValueError(f"art_lambda={art_lambda} must be >= 0")
        self.k = len(self.p_k)
        if m is not None and not self.k < m < num_classes:
            raise ValueError(f"m={m} must satisfy K={self.k} < m < classes={num_classes} (or be null)")
        self.method, self.m, self.top1_mode, self.num_classes = method, m, top1_mode, num_classes
        self.settings = dict(method=method, inverse_temperature=float(inverse_temperature), distribution=distribution,
                             art_lambda=float(art_lambda), sinkhorn_iterations=sinkhorn_iterations)
        self.num_inputs = m if m is not None else num_classes
        self._operators: dict[str, callable] = {}
        self.operator("cpu")  # built now so that a missing dependency fails at construction


    def operator(self, device) -> callable:
        """The method's ``scores -> P_topk`` on ``device`` (difftopk's networks are device-bound)."""
        key = str(device)
        if key not in self._operators:
            self._operators[key] = METHODS[self.method](self.num_inputs, self.k, {**self.settings, "device": key})
        return self._operators[key]

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.long()
        if self.m is not None:
            output, target = select_top_m(output, target, self.m)
        rows = torch.arange(len(target), device=output.device)
        p_topk = self.operator(output.device)(output, self.k)
        within_top = p_topk.flip(-1).cumsum(-1)[rows, target]  # (B, K): P(true class among the top j+1)
        weights = torch.tensor(self.p_k, dtype=within_top.dtype, device=output.device)
        if self.top1_mode == "sort":
            return -torch.log((within_top * weights).sum(-1) * (1 - 2e-7) + 1e-7)
        rest = (within_top[:, 1:] * weights[1:]).sum(-1)
        if self.top1_mode == "sm":
            top1 = torch.softmax(output, dim=-1)[rows, target]
            return -torch.log((self.p_k[0] * top1 + rest) * (1 - 2e-7) + 1e-7)
        ce = F.cross_entropy(output, target, reduction="none")
        return self.p_k[0] * ce + sum(self.p_k[1:]) * -torch.log(rest * (1 - 2e-7) + 1e-7)
