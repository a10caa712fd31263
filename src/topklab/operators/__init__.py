"""Differentiable top-k operators under one API (:mod:`topklab.operators.base`): each gives a soft
top-k indicator ``soft_topk(scores, k)`` of shape (batch, n) and, where the method has one, a
relaxed top-k permutation ``permutation(scores, k)`` of shape (batch, n, k), column 0 = top-1; all
follow one rule for ±inf, NaN and empty input (see :mod:`topklab.operators.base`).
Configs: ``configs/operator/<name>.yaml``."""

from topklab.operators.base import TopKOperator, hard_permutation, hard_topk
from topklab.operators.dftopk import DFTopK
from topklab.operators.diffsortnet import DiffSortNet
from topklab.operators.difftopk_network import DifftopkNetwork
from topklab.operators.lapsum import LapSum
from topklab.operators.neuralsort import NeuralSort
from topklab.operators.perturbed import PerturbedTopK
from topklab.operators.sinkhorn_sort import SinkhornSort
from topklab.operators.soft_topk_ot import SoftTopKOT
from topklab.operators.softsort import SoftSort
from topklab.operators.sparse_topk import SparseTopK
from topklab.operators.stk_threshold import STkThreshold

__all__ = [
    "DFTopK",
    "DiffSortNet",
    "DifftopkNetwork",
    "LapSum",
    "NeuralSort",
    "PerturbedTopK",
    "STkThreshold",
    "SinkhornSort",
    "SoftSort",
    "SoftTopKOT",
    "SparseTopK",
    "TopKOperator",
    "hard_permutation",
    "hard_topk",
]
