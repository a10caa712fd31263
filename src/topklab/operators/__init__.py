"""Differentiable sorting operators that difftopk does not ship."""
from topklab.operators.sinkhorn_sort import SinkhornSort

__all__ = ["SinkhornSort"]
