"""Differentiable top-k operators under one API (:mod:`topklab.operators.base`): each gives a soft
top-k indicator ``soft_topk(scores, k)`` of shape (batch, n) and, where the method has one, a
relaxed top-k permutation ``permutation(scores, k)`` of shape (batch, n, k), column 0 = top-1.
Configs: ``configs/operator/<name>.yaml``."""
from topklab.operators.base import TopKOperator, hard_permutation, hard_topk
from topklab.operators.diffsortnet import DiffSortNet
from topklab.operators.difftopk_network import DifftopkNetwork
from topklab.operators.neuralsort import NeuralSort
from topklab.operators.sinkhorn_sort import SinkhornSort
from topklab.operators.softsort import SoftSort

__all__ = ["DiffSortNet", "DifftopkNetwork", "NeuralSort", "SinkhornSort", "SoftSort", "TopKOperator",
           "hard_permutation", "hard_topk"]
