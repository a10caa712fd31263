"""The aggregate-loss contract: one batch-native kernel per aggregate, which the module forward (on
losses of any shape ``(..., n)``, reduced over ``dim``) and the population executor
(:mod:`topklab.engine.population`) both call."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from topklab.utils.errors import TopklabError
from topklab.utils.k import check_k_tensor, resolve_k, resolve_k_tensor, validate_k

HALF = (torch.float16, torch.bfloat16)


class AggregateInputError(TopklabError, ValueError):
    """Losses, ``dim`` or ``k`` an aggregate cannot take (a ``ValueError`` too, as these were before)."""


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an aggregate computes in: float32 for float16/bfloat16 losses, else their own.

    Examples
    --------
    >>> accumulation_dtype(torch.bfloat16), accumulation_dtype(torch.float64)
    (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in HALF else dtype


def check_dim(dim: int) -> int:
    """``dim`` if it is an int (the axis an aggregate reduces), else a one-line error."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise AggregateInputError(f"dim={dim!r} must be an int, the axis of the losses to aggregate (default -1)")
    return int(dim)


def check_k(k: int | float | torch.Tensor) -> int | float | torch.Tensor:
    """``k`` as :func:`~topklab.utils.k.validate_k` checks a number; a tensor holds one k per row:
    counts (an integer dtype, each >= 1) or fractions (a floating dtype, each in (0, 1]), kept on the
    CPU (a detached copy; :func:`~topklab.utils.k.check_k_tensor`).

    Examples
    --------
    >>> check_k(0.5), check_k(torch.tensor([1, 3]))
    (0.5, tensor([1, 3]))
    """
    return check_k_tensor(k, AggregateInputError) if isinstance(k, torch.Tensor) else validate_k(k)


def check_losses(losses: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``losses`` in the dtype the aggregate computes in (:func:`accumulation_dtype`) if it is a
    floating tensor of per-sample losses with at least one loss along ``dim`` and at least one row,
    else a one-line :class:`AggregateInputError`.

    Examples
    --------
    >>> check_losses(torch.tensor([[1.0, 2.0]], dtype=torch.float16)).dtype
    torch.float32
    >>> check_losses(torch.tensor([1, 2]))
    Traceback (most recent call last):
    ...
    topklab.losses.aggregate.base.AggregateInputError: an aggregate loss takes floating-point losses, got torch.int64; convert them (losses.float())
    """
    if not isinstance(losses, torch.Tensor) or losses.dim() == 0:
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise AggregateInputError(
            f"an aggregate loss takes per-sample losses (..., n), at least a 1-D tensor, got {shape}; "
            f"compute the individual loss with reduction='none'"
        )
    if not losses.is_floating_point():
        raise AggregateInputError(
            f"an aggregate loss takes floating-point losses, got {losses.dtype}; convert them (losses.float())"
        )
    if not -losses.dim() <= dim < losses.dim():
        raise AggregateInputError(
            f"dim={dim} is out of range for losses of shape {tuple(losses.shape)}; "
            f"use a dim in [{-losses.dim()}, {losses.dim() - 1}]"
        )
    if losses.shape[dim] == 0:
        raise AggregateInputError("cannot aggregate an empty batch of losses (n=0)")
    if losses.numel() == 0:
        raise AggregateInputError(f"losses of shape {tuple(losses.shape)} hold no rows to aggregate")
    return losses.to(accumulation_dtype(losses.dtype))


def resolve_count(k: int | float, n: int) -> int:
    """:func:`~topklab.utils.k.resolve_k` of a number, a count larger than ``n`` an :class:`AggregateInputError`.

    Examples
    --------
    >>> resolve_count(0.7, 1000), resolve_count(701, 1000)
    (700, 701)
    """
    if isinstance(k, int) and k > n:
        raise AggregateInputError(
            f"k={k} exceeds the number of losses n={n}; use k <= n (e.g. a batch of at least {k}) "
            f"or a fraction in (0, 1]"
        )
    return resolve_k(k, n)


def mean_without_overflow(plain: torch.Tensor, values: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``plain`` (P,), a row mean of ``values`` (P, m) over ``count`` (P,) as an aggregate computes it;
    where it overflowed to ±inf while the mean is finite, the mean with each term divided by the count
    in float64 instead. Ordinary rows keep ``plain`` and its gradient bit for bit. On a CPU the float64
    pass runs only when a row overflowed; elsewhere it always runs (a check would synchronise).

    Examples
    --------
    >>> values = torch.tensor([[3e38, 3e38], [1.0, 2.0]])
    >>> mean_without_overflow(values.mean(1), values, torch.tensor([2.0, 2.0]))
    tensor([3.0000e+38, 1.5000e+00])
    """
    if plain.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(torch.isinf(plain).any()):
        return plain  # the usual case on a CPU, where the check costs no synchronisation
    wide = (values.to(torch.float64) / count.to(torch.float64)[:, None]).sum(1).to(values.dtype)
    return torch.where(torch.isinf(plain) & torch.isfinite(wide), wide, plain)


ONE_ROW_DTYPES = (torch.float32, torch.float64)


class Aggregate(nn.Module):
    """An aggregate loss: n per-sample losses -> one number (STk paper §3-4), for every row of a
    batch of them.

    Subclasses implement :meth:`batched` on a (P, n) block of P independent rows (members) and
    declare what a hyperparameter grid may vary:

    - ``hyperparameters``: the grid axes the aggregate uses, a subset of ``("k", "delta")``;
    - ``has_threshold``: whether it owns a trainable threshold λ (MATk, STk).

    ``forward(losses)`` takes losses of shape ``(..., n)`` along ``dim`` (any other shape with
    ``dim`` naming the axis of the n losses), reduces over ``dim`` and is batched over the other
    axes: it moves ``dim`` last, flattens the rest into P rows and runs ``batched`` with the module's
    own k (resolved to a count for this n; one per row where k is a tensor), λ and δ, so a single
    model and a population run the same kernel. The result has the input's shape without ``dim``.
    Float16 and bfloat16 losses are aggregated in float32 (k and every count included) and the result
    is returned in the input dtype; float32 and float64 are computed in their own dtype. Integer
    losses, an empty ``dim`` and a k larger than n are one-line :class:`AggregateInputError`s; a NaN
    loss makes its row's value NaN (checking for one would synchronise a GPU on every call).

    Examples
    --------
    >>> from topklab.losses import ATk
    >>> ATk.hyperparameters, ATk.has_threshold
    (('k',), False)
    >>> ATk(k=2).batched(torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 8.0]]), torch.tensor([2.0, 1.0]), None, None)
    tensor([4., 8.])
    >>> ATk(k=2, dim=0)(torch.tensor([[1.0, 2.0], [5.0, 2.0], [3.0, 8.0]]))  # each column's top 2
    tensor([4., 5.])
    """

    hyperparameters: tuple[str, ...] = ()
    has_threshold: bool = False
    k: int | float | torch.Tensor | None = None  # the module's own k (None: the aggregate has no k)
    delta: float | None = None  # the module's own δ (None: the aggregate has no δ)
    dim: int = -1  # the axis of the losses that forward reduces

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = check_dim(dim)

    def batched(
        self, losses: torch.Tensor, k: torch.Tensor, lam: torch.Tensor | None, delta: torch.Tensor | None
    ) -> torch.Tensor:
        """The aggregate of each row of ``losses`` (P, n) -> (P,).

        Parameters
        ----------
        losses : Tensor (P, n), per-sample losses, one row per member
        k : Tensor (P,), per-row k as a count in [1, n] (resolve fractions with
            :func:`topklab.utils.k.resolve_k` first), in float32 or float64 (a half dtype cannot hold
            every count above 256); ignored without ``"k"`` in ``hyperparameters``
        lam : Tensor (P,) or None, per-row effective threshold λ; used only when ``has_threshold``
        delta : Tensor (P,) or None, per-row smoothing width δ > 0; used only with ``"delta"``
        """
        raise NotImplementedError(f"{type(self).__name__} must implement batched(losses, k, lam, delta)")

    def as_rows(self, losses: torch.Tensor) -> torch.Tensor:
        """``losses`` (..., n, ...) as the (P, n) block :meth:`batched` takes: ``dim`` moved last, the
        other axes flattened into rows, in the dtype the aggregate computes in."""
        moved = check_losses(losses, self.dim).movedim(self.dim, -1)
        return moved.reshape(-1, moved.shape[-1])

    def from_rows(self, values: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """The (P,) row values of ``losses`` in its shape without ``dim`` and its dtype."""
        return values.reshape(self._batch(losses)).to(losses.dtype)

    def counts(self, rows: torch.Tensor, batch: torch.Size) -> tuple[torch.Tensor, int | None]:
        """Each row's k (P,) as a count for rows of ``rows`` (P, n), in float32 (float64 for float64
        rows), and that count as an int where every row shares it (None for a tensor k). ``batch``
        is the losses' shape without ``dim``, which a tensor k broadcasts to.

        Examples
        --------
        >>> from topklab.losses import ATk
        >>> ATk(k=0.5).counts(torch.zeros(2, 5, dtype=torch.bfloat16), torch.Size([2]))
        (tensor([3., 3.]), 3)
        >>> ATk(k=torch.tensor([1, 4])).counts(torch.zeros(2, 5), torch.Size([2]))
        (tensor([1., 4.]), None)
        """
        n = rows.shape[1]
        dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
        if not isinstance(self.k, torch.Tensor):
            count = n if self.k is None else resolve_count(self.k, n)
            return torch.full(rows.shape[:1], count, dtype=dtype, device=rows.device), count
        k = resolve_k_tensor(self.k, n, batch, self.dim, AggregateInputError)
        return k.to(dtype=dtype, device=rows.device), None

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """The aggregate of ``losses`` (..., n) over ``dim``, one value per row (see the class)."""
        rows = self.as_rows(losses)
        k, _ = self.counts(rows, self._batch(losses))
        lam = self.threshold.to(rows.dtype).expand(rows.shape[0]) if self.has_threshold else None
        delta = None if self.delta is None else rows.new_full(rows.shape[:1], self.delta)
        return self.from_rows(self.batched(rows, k, lam, delta), losses)

    def one_row(self, losses, cpu: bool = True) -> bool:
        """Whether ``losses`` is the usual call a subclass may answer directly, with a few checks
        instead of :func:`check_losses` and the batched path: a non-empty 1-D float32/float64 tensor
        (on the CPU where ``cpu``) reduced over its only axis."""
        return (
            type(losses) is torch.Tensor
            and losses.dim() == 1
            and losses.dtype in ONE_ROW_DTYPES
            and (losses.is_cpu or not cpu)
            and self.dim in (-1, 0)
            and losses.shape[0] > 0
        )

    def _batch(self, losses: torch.Tensor) -> torch.Size:
        """The shape of ``losses`` without ``dim`` (checked by :meth:`rows` first)."""
        axis = self.dim % losses.dim()
        return losses.shape[:axis] + losses.shape[axis + 1 :]

    def _dim_repr(self) -> str:
        return "" if self.dim == -1 else f", dim={self.dim}"
