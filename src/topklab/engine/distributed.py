"""Multi-process training with DistributedDataParallel (DDP): the process context, data sharding,
gathering of metrics, and the exact global top-k under DDP.

``torchrun --nproc_per_node W train.py …`` starts W processes (ranks) with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set.
:meth:`Distributed.from_env` reads them; without them the run is one process and every function
here is a no-op, so the engine calls them unconditionally.

- **Training batches**: every rank draws the same global batch of indices (the order a single
  process would use) and keeps its contiguous chunk, :func:`shard_batch`; concatenating the
  chunks in rank order gives the global batch. DDP averages the gradients over the W ranks.
- **Evaluation**: rank r scores the contiguous slice :func:`shard_slice` of each split and
  :func:`gather_concat` concatenates the ranks' outputs in rank order, i.e. in dataset order.
- Only the rank with :attr:`Distributed.is_main` writes records and checkpoints.

What k means under DDP
----------------------
W ranks each hold a local batch of m samples, the global batch has n = W·m, and DDP averages the
ranks' gradients, so the step follows the gradient of the *mean over ranks of the local
objectives*. λ of MATk/STk is a parameter of the wrapped Objective, so its gradient is averaged
with the model's and every rank keeps the same λ.

*Without gathering* (``aggregate(losses)``, the aggregate sees the rank's m losses):

- **Average**: the mean of the local means is the global mean (1/n)·Σ ℓ_i: exact.
- **MATk and STk, k a fraction**: the mean of the local objectives is
  (1/n)·Σ_i φ(ℓ_i − λ) + (k_m/m)·λ with k_m = resolve_k(k, m), i.e. the global-batch objective
  with the fraction k_m/m = round(k·m)/m (half-up, at least 1), with its gradient for the model
  and for λ. That is the global-batch objective with k itself, (1/n)·Σ_i φ(ℓ_i − λ) + (k_n/n)·λ
  with k_n = resolve_k(k, n), whenever k·m is a whole number (k = 0.5 with m even, k = 0.9 with
  m a multiple of 10); e.g. k = 0.375 with m = 4 gives k_m/m = 0.5 but k_n/n = 3/8 for n = 8.
  ``scale="atk"`` (factor n/k_n = m/k_m) is covered too.
- **MATk and STk, k a count**: each rank keeps k of its m samples, so the run optimises the
  global objective with the count W·k. Pass k/W (a whole number), or the fraction k/n, to mean
  k of the global batch.
- **ATk and Maximum are not sums over samples**: the mean of the W local top-k averages is not
  the global top-k average (it differs whenever the global top k are not spread over the ranks
  as k/W each). Gather the losses for the exact global top-k.

*With gathering* (``aggregate(all_gather_losses(losses))``): every rank aggregates the same
global (n,) vector, in rank order, which is the single-process batch order. A count k is k of the
n global losses and a fraction k is a fraction of n. The value is the single-process value on
every rank, and after DDP's averaging the gradients of the model and of λ are the single-process
gradients, for every aggregate and for any split of the batch over the ranks (even uneven).

Both hold for the loss only: a penalty added on every rank is averaged to itself (exact), while
BatchNorm normalises with the statistics of the local batch unless the model is converted with
``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.

Examples
--------
>>> ctx = Distributed.from_env({})          # no torchrun variables: one process
>>> (ctx.rank, ctx.world_size, ctx.is_main)
(0, 1, True)
>>> shard_batch([7, 3, 5, 1, 0, 2], rank=1, world_size=2)
[1, 0, 2]
"""

from __future__ import annotations

import gc
import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from topklab.utils.errors import TopklabError

BACKENDS = ("gloo", "nccl")
UNEVEN = ("error", "drop", "split")
_MAX_DIMS = 7  # gather_concat sends every rank's shape in a fixed-length vector


def _env_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except KeyError:
        raise TopklabError(
            f"WORLD_SIZE={environ['WORLD_SIZE']} but {name} is not set; launch with "
            f"`torchrun --nproc_per_node N train.py …`, which sets RANK, WORLD_SIZE and LOCAL_RANK"
        ) from None
    except ValueError:
        raise TopklabError(f"{name}={environ[name]!r} must be a whole number (set by torchrun)") from None


def _check_rank(rank: int, world_size: int) -> None:
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise TopklabError(
            f"rank={rank!r} with world_size={world_size!r} is impossible; "
            f"world_size must be an int >= 1 and rank an int in [0, world_size)"
        )


@dataclass(frozen=True)
class Distributed:
    """Where this process stands in a (possibly one-process) DDP run.

    Parameters
    ----------
    rank : int
        Global rank in ``[0, world_size)``.
    world_size : int
        Number of processes W; 1 means a plain single-process run (everything is a no-op).
    local_rank : int
        Rank on this machine; with CUDA it picks the GPU ``cuda:local_rank``.
    backend : {"gloo", "nccl"}
        ``nccl`` for CUDA, ``gloo`` for CPU; :meth:`from_env` picks it.

    Examples
    --------
    >>> ctx = Distributed.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, backend="gloo")
    >>> (ctx.rank, ctx.world_size, ctx.is_main, ctx.device)
    (1, 2, False, device(type='cpu'))
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "gloo"

    def __post_init__(self):
        _check_rank(self.rank, self.world_size)
        if not (isinstance(self.local_rank, int) and self.local_rank >= 0):
            raise TopklabError(f"LOCAL_RANK={self.local_rank!r} must be a whole number >= 0 (set by torchrun)")
        if self.backend not in BACKENDS:
            raise TopklabError(f"unknown DDP backend {self.backend!r}; choose one of: {', '.join(BACKENDS)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, backend: str | None = None) -> Distributed:
        """Read torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.

        Parameters
        ----------
        environ : mapping, optional
            The environment to read; ``os.environ`` by default.
        backend : {"gloo", "nccl"}, optional
            Default: ``nccl`` when CUDA is available, else ``gloo``.

        Without ``WORLD_SIZE`` (or with ``WORLD_SIZE=1``) the result is the single-process
        context (rank 0 of 1). With ``WORLD_SIZE > 1``, ``RANK`` and ``LOCAL_RANK`` must be set.

        Examples
        --------
        >>> Distributed.from_env({}).world_size
        1
        >>> Distributed.from_env({"WORLD_SIZE": "2"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        topklab.utils.errors.TopklabError: WORLD_SIZE=2 but RANK is not set; launch with `torchrun ...
        """
        environ = os.environ if environ is None else environ
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "WORLD_SIZE" not in environ:
            return cls(backend=backend)
        world_size = _env_int(environ, "WORLD_SIZE")
        if world_size == 1:
            return cls(backend=backend)
        return cls(_env_int(environ, "RANK"), world_size, _env_int(environ, "LOCAL_RANK"), backend)

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes records and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when there is more than one process."""
        return self.world_size > 1

    @property
    def device(self) -> torch.device:
        """``cuda:local_rank`` with the nccl backend, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def init(self, init_method: str = "env://", timeout: timedelta | None = None) -> Distributed:
        """Start the process group (a no-op for one process); with nccl, pin ``cuda:local_rank``.

        Parameters
        ----------
        init_method : str
            ``env://`` (torchrun's ``MASTER_ADDR``/``MASTER_PORT``) or ``file:///path`` (a shared file).
        timeout : timedelta, optional
            How long collectives wait for the other ranks; torch's default when omitted.

        Examples
        --------
        >>> Distributed().init().world_size   # one process: nothing to start
        1
        """
        if not self.is_distributed:
            return self
        if init_method == "env://":
            missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
            if missing:
                raise TopklabError(
                    f"WORLD_SIZE={self.world_size} but {' and '.join(missing)} not set; launch with "
                    f"torchrun, which sets them, or pass init_method='file:///shared/path'"
                )
        if self.backend == "nccl":
            if self.local_rank >= torch.cuda.device_count():
                raise TopklabError(
                    f"LOCAL_RANK={self.local_rank} but only {torch.cuda.device_count()} CUDA device(s) "
                    f"are visible; use --nproc_per_node <= the number of GPUs"
                )
            torch.cuda.set_device(self.local_rank)
        # torch.distributed.nn.functional binds group.WORLD as its functions' default argument when it
        # is first imported; DistributedDataParallel imports it, so after init_process_group that pins
        # the process group: destroy_process_group would then not free it, and gloo's threads would
        # outlive it into interpreter exit (where they can abort the process). Imported now, it binds None.
        importlib.import_module("torch.distributed.nn")
        dist.init_process_group(
            self.backend, init_method=init_method, timeout=timeout, world_size=self.world_size, rank=self.rank
        )
        return self

    def wrap(self, module: nn.Module, **ddp_kwargs) -> nn.Module:
        """Wrap ``module`` (already on :attr:`device`) in DistributedDataParallel; one process: as is.

        Wrap the whole Objective (model + aggregate) so that λ is all-reduced with the model.

        Examples
        --------
        >>> m = nn.Linear(2, 1)
        >>> Distributed().wrap(m) is m
        True
        """
        if not self.is_distributed:
            return module
        device_ids = [self.local_rank] if self.backend == "nccl" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **ddp_kwargs)

    def barrier(self) -> None:
        """Wait for every rank (a no-op for one process)."""
        if dist.is_initialized():
            dist.barrier(device_ids=[self.local_rank] if self.backend == "nccl" else None)

    def close(self) -> None:
        """Shut the process group down (a no-op when none was started).

        Only the last reference frees a process group and joins gloo's threads. The DDP wrapper
        (its reducer holds the group) may be left in a reference cycle: collect it first, so that
        the threads end here rather than at interpreter exit, where one that drops a tensor aborts
        the process (``terminate called without an active exception``).
        """
        if dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()


def shard_slice(n: int, rank: int, world_size: int) -> slice:
    """The contiguous part of ``n`` items that ``rank`` takes: ranks below ``n % world_size`` take
    one more item than the others, and the slices of ranks 0, 1, … cover ``0..n`` in order.

    For evaluation sets: each rank scores its slice and :func:`gather_concat` restores dataset order.

    Parameters
    ----------
    n : int
        Number of items (samples of a split, or indices of a batch).
    rank, world_size : int
        This process and the number of processes.

    Examples
    --------
    >>> [shard_slice(10, r, 4) for r in range(4)]
    [slice(0, 3, None), slice(3, 6, None), slice(6, 8, None), slice(8, 10, None)]
    """
    _check_rank(rank, world_size)
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def shard_batch(indices: Sequence | torch.Tensor, rank: int, world_size: int, uneven: str = "error"):
    """This rank's contiguous chunk of one global batch of sample indices.

    Every rank passes the same global batch (the order one process would use); the chunks of
    ranks 0, 1, … concatenated give the global batch. Equal chunks keep MATk/STk/Average exact
    under DDP (see "What k means under DDP" in the module docstring).

    Parameters
    ----------
    indices : sequence or tensor
        The global batch's sample indices (anything sliceable with ``len``).
    rank, world_size : int
        This process and the number of processes.
    uneven : {"error", "drop", "split"}
        When ``len(indices)`` is not divisible by ``world_size``: ``error`` refuses (the default),
        ``drop`` leaves out the last ``len % world_size`` indices so that every rank gets
        ``len // world_size`` (all ranks get an empty chunk when the batch is smaller than the
        world: skip that batch), ``split`` gives the first ``len % world_size`` ranks one index
        more (exact only with :func:`all_gather_losses`).

    Examples
    --------
    >>> shard_batch(list(range(8)), rank=1, world_size=4)
    [2, 3]
    >>> shard_batch(list(range(7)), rank=1, world_size=2, uneven="drop")
    [3, 4, 5]
    >>> shard_batch(list(range(7)), rank=1, world_size=2, uneven="split")
    [4, 5, 6]
    """
    _check_rank(rank, world_size)
    if uneven not in UNEVEN:
        raise TopklabError(f"unknown uneven={uneven!r}; choose one of: {', '.join(UNEVEN)}")
    n = len(indices)
    if n % world_size and uneven == "error":
        raise TopklabError(
            f"a global batch of {n} samples does not split evenly over world size {world_size}; use "
            f"a batch_size divisible by {world_size} and drop_last for the final batch, "
            f"or uneven='drop'/'split'"
        )
    if uneven == "drop":
        n -= n % world_size
    return indices[shard_slice(n, rank, world_size)]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather_rows(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (first dimensions may differ, the others must agree), in rank order."""
    if tensor.dim() == 0 or tensor.dim() > _MAX_DIMS:
        raise TopklabError(
            f"can only gather tensors with 1 to {_MAX_DIMS} dimensions (rows first), got shape "
            f"{tuple(tensor.shape)}; reshape it, e.g. tensor.reshape(1) for a scalar"
        )
    comm = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    shape = torch.full((_MAX_DIMS + 1,), -1, dtype=torch.long, device=comm)
    shape[0] = tensor.dim()
    shape[1 : tensor.dim() + 1] = torch.tensor(tensor.shape)
    shapes = [torch.empty_like(shape) for _ in range(dist.get_world_size())]
    dist.all_gather(shapes, shape)
    shapes = [tuple(s[1 : int(s[0]) + 1].tolist()) for s in shapes]
    if len({s[1:] for s in shapes}) > 1:  # every rank sees the same shapes, so every rank raises
        raise TopklabError(
            f"cannot concatenate the ranks' tensors of shapes {shapes}: all dimensions but the first "
            f"must agree; give every rank tensors of the same trailing shape"
        )
    rows = [s[0] for s in shapes]
    padded = tensor.new_zeros((max(rows), *tensor.shape[1:]), device=comm)
    padded[: tensor.shape[0]] = tensor.detach()
    parts = [torch.empty_like(padded) for _ in rows]
    dist.all_gather(parts, padded)
    return [part[:r].to(tensor.device) for part, r in zip(parts, rows)]


def gather_concat(tensor: torch.Tensor) -> torch.Tensor:
    """All ranks' ``tensor`` concatenated along the first dimension in rank order, on every rank.

    The first dimensions may differ between ranks (pad and trim), the others must agree. Not
    differentiable: for metrics and predictions. One process: ``tensor`` itself.

    Parameters
    ----------
    tensor : tensor
        This rank's rows, e.g. the predictions for its :func:`shard_slice` of a split.

    Examples
    --------
    >>> gather_concat(torch.tensor([1, 2, 3]))   # one process
    tensor([1, 2, 3])
    """
    if _rank_and_world()[1] == 1:
        return tensor
    return torch.cat(_all_gather_rows(tensor))


class _AllGatherLosses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, losses: torch.Tensor) -> torch.Tensor:
        rank, world = _rank_and_world()
        parts = _all_gather_rows(losses)
        ctx.start = sum(part.shape[0] for part in parts[:rank])
        ctx.stop = ctx.start + losses.shape[0]
        ctx.world = world
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad[ctx.start : ctx.stop] * ctx.world


def all_gather_losses(losses: torch.Tensor) -> torch.Tensor:
    """The per-sample losses of every rank as one global (n,) vector in rank order, differentiable.

    ``aggregate(all_gather_losses(individual(model(x), y)))`` is the single-process aggregate of
    the global batch on every rank (the exact global top-k for ATk; k refers to the global batch).

    **Gradient.** The backward returns this rank's slice of the incoming gradient times W (the
    world size). Every rank computes the same L(ℓ_1, …, ℓ_n), so g_i = ∂L/∂ℓ_i is the same on
    every rank, and rank r's graph reaches the model only through its own samples: its model
    gradient is W·Σ_{i∈r} g_i·∇ℓ_i. DDP averages over the W ranks:
    (1/W)·Σ_r W·Σ_{i∈r} g_i·∇ℓ_i = Σ_i g_i·∇ℓ_i = ∇L, the single-process gradient. Parameters
    of the aggregate (λ) see the whole gathered vector and get the full ∂L/∂λ on every rank, so
    averaging W equal values leaves them unchanged: no factor there. The factor assumes that
    every rank computes the same objective from the gathered vector, as the line above does.
    One process: ``losses`` itself.

    Parameters
    ----------
    losses : tensor, shape (m,)
        This rank's per-sample losses; m may differ between ranks.

    Examples
    --------
    >>> from topklab.losses import ATk
    >>> ATk(k=2)(all_gather_losses(torch.tensor([1.0, 5.0, 3.0, 0.0])))   # one process
    tensor(4.)
    """
    if losses.dim() != 1:
        raise TopklabError(
            f"all_gather_losses takes the 1-D per-sample losses, got shape {tuple(losses.shape)}; "
            f"compute the individual loss with reduction='none' and flatten it"
        )
    if _rank_and_world()[1] == 1:
        return losses
    return _AllGatherLosses.apply(losses)
