"""difftopk's own sorting networks behind this package's operator API (the reference our
DiffSortNet is tested and benchmarked against)."""
from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, check_scores, positive
from topklab.operators.relaxations import check_distribution

SPARSE_HINT = ("needs torch-sparse, which is not installed; build it with `make sparse` (about 11 minutes on 2 "
               "cores) or use operator=bitonic / odd_even / splitter_selection (this package's networks)")
NETWORK_KINDS = ("odd_even", "bitonic", "splitter_selection")


def difftopk_module(name: str = "difftopk"):
    """Import difftopk (or a submodule) without its print about the optional torch-sparse."""
    import contextlib
    import importlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module(name)


class DifftopkNetwork(TopKOperator):
    """difftopk 0.2.0's ``DiffTopkNet`` (Petersen et al., ICML 2022): the top-k columns of a
    differentiable sorting network, computed with dense n×n layer matrices (``sparse=False``) or
    torch-sparse products (``sparse=True``; splitter_selection exists only so). Columns are
    reordered to this package's convention (column 0 = top-1). Slow: use :class:`DiffSortNet`,
    which gives the same permutation; this one is kept as the reference.

    Parameters
    ----------
    network : "odd_even" | "bitonic" | "splitter_selection"
    sparse : bool, difftopk's sparse implementation (needs torch-sparse: ``make sparse``)
    steepness, distribution, art_lambda : as :class:`DiffSortNet` (β larger is sharper)

    Examples
    --------
    >>> DifftopkNetwork("odd_even", steepness=100.0, distribution="logistic").permutation(
    ...     torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 1).round()
    tensor([[[0.],
             [1.],
             [0.],
             [0.]]])
    """

    gives_permutation = True
    sums_to_k = True

    def __init__(self, network: str = "odd_even", sparse: bool = False, steepness: float = 10.0,
                 distribution: str = "cauchy", art_lambda: float = 0.25):
        super().__init__()
        if network not in NETWORK_KINDS:
            raise ValueError(f"network={network!r} is unknown; choose one of {', '.join(NETWORK_KINDS)}")
        if network == "splitter_selection" and not sparse:
            raise ValueError("difftopk has splitter_selection only as a sparse network; set sparse=true")
        if sparse and not difftopk_module("difftopk.functional").SPARSE_INSTALLED:
            raise ValueError(f"difftopk's sparse {network} {SPARSE_HINT}")
        self.network, self.sparse = network, bool(sparse)
        self.steepness = positive(steepness, "steepness", "larger is sharper")
        self.distribution = check_distribution(distribution)
        self.art_lambda = float(art_lambda)
        self._nets: dict[tuple, torch.nn.Module] = {}

    def extra_repr(self) -> str:
        return f"{self.network}, sparse={self.sparse}, steepness={self.steepness}, distribution={self.distribution}"

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "DifftopkNetwork")
        key = (scores.shape[1], k, str(scores.device))
        if key not in self._nets:
            self._nets[key] = difftopk_module().DiffTopkNet(
                self.network, scores.shape[1], k, sparse=self.sparse, device=str(scores.device),
                steepness=self.steepness, art_lambda=self.art_lambda, distribution=self.distribution)
        return self._nets[key](scores)[1].flip(-1)
