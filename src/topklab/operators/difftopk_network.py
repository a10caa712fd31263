"""difftopk's own sorting networks behind this package's operator API (the reference our
DiffSortNet is tested and benchmarked against)."""

from __future__ import annotations

import contextlib

import torch

from topklab.operators.base import TopKOperator, positive
from topklab.operators.relaxations import check_distribution

SPARSE_HINT = (
    "needs torch-sparse, which is not installed; build it with `make sparse` (about 11 minutes on 2 "
    "cores) or use operator=bitonic / odd_even / splitter_selection (this package's networks)"
)
NETWORK_KINDS = ("odd_even", "bitonic", "splitter_selection")


def difftopk_module(name: str = "difftopk"):
    """Import difftopk (or a submodule) without its print about the optional torch-sparse."""
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

    Notes
    -----
    Extreme inputs and dtypes, as :class:`DiffSortNet`: ±inf by the rule of
    :mod:`topklab.operators.base` (each group of rows with the same number of finite entries runs
    difftopk's network of that size), a NaN row gives NaN, an empty batch an empty result. The
    network's matrices follow the scores' dtype: float64 runs difftopk in float64 (its
    ``torch.eye`` takes torch's default dtype, so the call sets float64 as the default for its
    duration: not thread-safe), float16 and bfloat16 run in float32; the result has the scores' dtype.
    Finite scores whose differences overflow the dtype (near both +max and −max) give NaN, as in
    difftopk.

    Examples
    --------
    >>> DifftopkNetwork("odd_even", steepness=100.0, distribution="logistic").permutation(
    ...     torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 1).round()
    tensor([[[0.],
             [1.],
             [0.],
             [0.]]])
    >>> DifftopkNetwork("odd_even", steepness=100.0, distribution="logistic").soft_topk(
    ...     torch.tensor([[0.1, 3.0, -float("inf"), 1.0]], dtype=torch.float64), 2)
    tensor([[0., 1., 0., 1.]], dtype=torch.float64)
    """

    gives_permutation = True
    sums_to_k = True
    masks_extremes = False  # difftopk's network is built for one n: rows with infinite scores run per group

    def __init__(
        self,
        network: str = "odd_even",
        sparse: bool = False,
        steepness: float = 10.0,
        distribution: str = "cauchy",
        art_lambda: float = 0.25,
    ):
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

    def _permutation(self, scores: torch.Tensor, k: int, rest=None) -> torch.Tensor:
        work = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
        key = (scores.shape[1], k, str(scores.device), work)
        if key not in self._nets:
            net = difftopk_module().DiffTopkNet(
                self.network,
                scores.shape[1],
                k,
                sparse=self.sparse,
                device=str(scores.device),
                steepness=self.steepness,
                art_lambda=self.art_lambda,
                distribution=self.distribution,
            )
            net.sorting_network = _to_dtype(net.sorting_network, work)
            self._nets[key] = net
        with _default_dtype(work):
            columns = self._nets[key](scores.to(work))[1]
        return columns.flip(-1).to(scores.dtype)


def _to_dtype(network, dtype: torch.dtype):
    """difftopk's nested lists of layer matrices with the floating-point ones in ``dtype`` (the
    0/1 entries are exact in any dtype); other entries (indices, torch-sparse objects) unchanged."""
    if isinstance(network, (list, tuple)):
        return type(network)(_to_dtype(item, dtype) for item in network)
    if isinstance(network, torch.Tensor) and network.is_floating_point():
        return network.to(dtype)
    return network


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """torch's default dtype set to ``dtype`` for the block (difftopk builds its identity matrices with it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
