"""The one API of every differentiable top-k operator.

Conventions, the same for every operator:

- ``scores`` is a float tensor of shape (batch, n); a larger score is more likely to be selected.
  Any shape works with ``dim`` (default −1), the axis of n: the other axes are a batch of rows,
  flattened for the operator's core and restored after. k is an int, or a float fraction of n in
  (0, 1] (rounded half up, at least 1), or a tensor of one k per row: the cores' shapes depend on k, so
  rows are then grouped by their count and the core called once per group (:func:`by_k`).
- ``soft_topk(scores, k)`` returns ``p`` of shape (batch, n): the relaxed indicator of the k
  largest scores, with entries in [0, 1] where the operator is ``bounded``. Its hard limit is 1 on
  the k largest and 0 elsewhere. NeuralSort and SoftSort are not bounded: their relaxed
  permutations are stochastic per rank (each column sums to 1 over the items) but not per item,
  so an item close to several ranks can collect more than 1 (e.g. 1.045 for NeuralSort at τ =
  0.01 on near-equal scores); neither paper clamps it, and neither do we.
- ``permutation(scores, k)`` returns ``P`` of shape (batch, n, k) (for (..., n) scores, (..., n, k)
  with ``dim`` moved before the k axis): ``P[b, i, j]`` is the relaxed
  probability that item i is the (j+1)-th largest, so column 0 is the top-1. Its hard limit is the
  one-hot rank of the k largest items. Summing the k columns gives a soft top-k indicator.

Each operator states what it promises through class attributes: ``gives_permutation``,
``sums_to_k`` (Σ p = k exactly), ``bounded`` (0 <= p <= 1; for the Sinkhorn-based operators up to their
row-sum tolerance), ``sparse`` (p has exact zeros and ones away from ties) and
``stochastic`` (a Monte-Carlo estimate, seeded).

Extreme inputs, the same for every operator (:meth:`TopKOperator.soft_topk` and
:meth:`TopKOperator.permutation` enforce them, :func:`extremes` and :func:`assemble` implement them):

- **±inf** scores take their limit. In a row with m₊ entries at +inf, m₋ at −inf and n_f finite
  ones, the +inf entries are selected (weight 1) and the finite entries get the operator's own soft
  top-k' of the finite entries alone, ``k' = min(k − m₊, n_f)`` (same settings, the infinite
  entries removed from the row); a −inf entry gets 0. In the permutation the +inf entries take
  ranks 1..m₊, the finite entries the operator's permutation of the finite rest in the ranks after
  them. Ties among infinities share: with m₊ > k each +inf entry gets k/m₊ (each of the k ranks
  1/m₊), and with fewer than k entries above −inf (m₊ + n_f < k) the −inf entries share the
  missing k − m₊ − n_f equally (each of those ranks 1/m₋). Rows therefore still sum to k where the
  operator does, and gradients reach the finite entries only (an infinite score gets 0).
  Where the operator's literal limit differs from this rule (the cost normalisation of SOFT top-k
  and the standardisation of SinkhornSort would make every finite entry tie, and a sorting
  network keeps the n-wire layout), the rule is what the operator computes; its docstring says so.
  Inside ``torch.compile`` the operators that group such rows (``masks_extremes = False``: the
  sorting networks, SparseTopK) give them NaN instead (:class:`TopKOperator`).
- **NaN**: a row with a NaN score gives a row of NaN (the whole row: every entry of p depends on
  every score); other rows are unaffected (a NaN row takes no part in SoftTopKOT's batch
  normalisation either). Nothing is raised, so there is no device synchronisation for the check.
- **Empty batch**: scores of shape (0, n) give p of shape (0, n) (P of shape (0, n, k)); k is still
  checked against n.
- **dtype**: the output has the scores' dtype; float16 and bfloat16 are computed in float32 where
  an operator needs it (DiffSortNet, DifftopkNetwork).
- Large finite scores (up to the dtype's maximum) give finite outputs; where an intermediate
  would overflow (a square, a division by a small temperature) the operators rescale or shift the
  scores first, or let it saturate at the limit it tends to. (Not difftopk's own network,
  DifftopkNetwork: it gives NaN where differences of scores overflow the dtype.)

>>> from topklab.operators import LapSum
>>> inf, nan = float("inf"), float("nan")
>>> scores = torch.tensor([[3.0, inf, 2.0, -inf], [1.0, nan, 0.0, 2.0], [inf, inf, inf, 0.0]], dtype=torch.float64)
>>> LapSum(alpha=0.5).soft_topk(scores, k=2).round(decimals=4)   # row 0: LapSum of [3, 2] with k = 1
tensor([[0.8161, 1.0000, 0.1839, 0.0000],
        [   nan,    nan,    nan,    nan],
        [0.6667, 0.6667, 0.6667, 0.0000]], dtype=torch.float64)
>>> LapSum().soft_topk(torch.zeros(0, 4), k=2).shape
torch.Size([0, 4])
>>> LapSum().soft_topk(torch.randn(5, 3, 2), k=0.5, dim=1).sum(1).round(decimals=4)  # k = 2 of n = 3
tensor([[2., 2.],
        [2., 2.],
        [2., 2.],
        [2., 2.],
        [2., 2.]])
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from topklab.utils.checks import check_int
from topklab.utils.k import check_k_tensor, resolve_k, resolve_k_tensor, validate_k

# the dtype of the all-finite check's sum: a sum of finite scores is finite unless it overflows (then the masked
# path runs, with the same result), and one non-finite score makes it non-finite; half scores sum in float32
SUM_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def check_scores(scores: torch.Tensor, k: int, name: str) -> None:
    """One-line errors for scores that are not (batch, n) floats and for k outside 1..n."""
    if scores.dim() != 2:
        raise ValueError(f"{name} takes scores of shape (batch, n), got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"{name} takes floating-point scores, got {scores.dtype}")
    check_int(f"{name}: k", k, 1, scores.shape[1], why="at most the row length n")


def as_rows(scores: torch.Tensor, k, dim: int, name: str) -> tuple[torch.Tensor, int | torch.Tensor, tuple[int, ...]]:
    """``scores`` of shape (..., n, ...) as the (batch, n) rows an operator's core takes (``dim`` the
    axis of n, the other axes flattened into the batch), k as a count of that n (an int, or a float
    fraction in (0, 1] rounded half up; a tensor of one k per row, counts or fractions, broadcast to the
    rows' shape: each row's count, (batch,) int64 on the CPU), and the shape of ``scores`` with ``dim``
    moved last. A view where ``dim`` is already the last axis of a contiguous tensor."""
    if not isinstance(scores, torch.Tensor) or scores.dim() == 0:
        raise ValueError(f"{name} takes scores of shape (..., n), got {getattr(scores, 'shape', type(scores))}")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"{name}: dim={dim} is not an axis of scores of shape {tuple(scores.shape)}")
    # (batch, n) scores as they are: a view would add an autograd node to every call
    moved = scores if dim in (-1, scores.dim() - 1) else scores.movedim(dim, -1)
    n = moved.shape[-1]
    if isinstance(k, torch.Tensor):
        try:
            k = resolve_k_tensor(check_k_tensor(k), n, moved.shape[:-1], dim, items="scores").long()
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    elif isinstance(k, float):
        try:
            k = resolve_k(validate_k(k), max(n, 1))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name}: {err}") from None
    return (moved if moved.dim() == 2 else moved.reshape(-1, n)), k, tuple(moved.shape)


def by_k(rows: torch.Tensor, counts: torch.Tensor, call, columns: bool) -> torch.Tensor:
    """``call(rows_k, k)`` once per distinct count k of ``counts`` (batch,), on the rows that have it,
    put back in the rows' order; a permutation's columns (``columns``) padded with zeros up to the
    largest k. One call where every row shares its k (k = 1 for an empty batch: no column is left)."""
    distinct = torch.unique(counts).tolist()
    if len(distinct) <= 1:
        out = call(rows, distinct[0] if distinct else 1)
        return out[:, :, :0] if columns and not distinct else out
    parts, order = [], []
    for k in distinct:  # ascending: a stochastic operator draws for the groups in this order
        index = (counts == k).nonzero()[:, 0]
        part = call(rows[index.to(rows.device)], k)
        parts.append(torch.nn.functional.pad(part, (0, distinct[-1] - k)) if columns else part)
        order.append(index)
    return torch.cat(parts)[torch.argsort(torch.cat(order)).to(rows.device)]


def positive(value: float, name: str, direction: str) -> float:
    """``value`` as a float, or a one-line error saying it must be > 0 and which way is sharper."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a number > 0 ({direction})")
    return float(value)


def power_of_two_scale(values: torch.Tensor) -> torch.Tensor:
    """Per row of ``values`` (batch, n, finite), a power of two c >= 1 with ``max |values| / c < 2``,
    (batch, 1), detached: dividing by it is exact (no rounding) and keeps squares and sums of the
    row finite; c = 1 for rows within [−1, 1]."""
    exponent = torch.frexp(values.detach().abs().amax(1, keepdim=True)).exponent
    return torch.ldexp(torch.ones_like(values[:, :1]), (exponent - 1).clamp(min=0))


class Extremes(NamedTuple):
    """What an operator's core sees of a row's infinite scores (see the module docstring).

    The core is called on scores whose finite entries are the input's and whose ±inf entries are
    kept in place (detached); rows that have nothing for the core to weigh (NaN, m₊ >= k, or no
    finite entry) are replaced by zeros, with ``finite`` all True, ``top`` 0, ``count`` n and
    ``rest_k`` k. For every row the core must return finite values; only the finite entries (and, for
    the permutation, the columns ``top .. top + rest_k − 1``) are used.
    """

    finite: torch.Tensor  # (batch, n) bool: the entries the operator weighs
    top: torch.Tensor  # (batch, 1) long: m₊, the +inf entries, which take ranks 1..m₊
    count: torch.Tensor  # (batch, 1) long: n_f >= 1, the finite entries
    rest_k: torch.Tensor  # (batch, 1) long: k' = min(k − m₊, n_f) >= 1, what the finite entries share
    live: torch.Tensor  # (batch, 1) bool: False on the stand-in rows (which must not affect the others)


class _Split(NamedTuple):
    """The input's own counts (before stand-in rows), for :func:`assemble`."""

    positive: torch.Tensor  # (batch, n) bool, +inf
    negative: torch.Tensor  # (batch, n) bool, −inf
    finite: torch.Tensor  # (batch, n) bool
    nan_row: torch.Tensor  # (batch, 1) bool
    live: torch.Tensor  # (batch, 1) bool: the core's values are used on this row's finite entries
    top: torch.Tensor  # (batch, 1) long, m₊
    bottom: torch.Tensor  # (batch, 1) long, m₋
    count: torch.Tensor  # (batch, 1) long, n_f
    rest_k: torch.Tensor  # (batch, 1) long, k' (<= 0 where m₊ >= k)


def extremes(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, Extremes, _Split]:
    """The core's input and :class:`Extremes`, and the split that :func:`assemble` needs.

    Vectorised: masks and counts per row, no synchronisation and no branch on the data."""
    n = scores.shape[1]
    positive_, negative_ = torch.isposinf(scores), torch.isneginf(scores)
    finite = torch.isfinite(scores)
    nan_row = torch.isnan(scores).any(1, keepdim=True)
    top, bottom = positive_.sum(1, keepdim=True), negative_.sum(1, keepdim=True)
    count = finite.sum(1, keepdim=True)
    rest_k = torch.minimum(k - top, count)
    live = (rest_k >= 1) & ~nan_row
    core = torch.where(
        live, torch.where(finite, scores, scores.detach()), torch.zeros((), dtype=scores.dtype, device=scores.device)
    )
    rest = Extremes(
        finite | ~live, torch.where(live, top, 0), torch.where(live, count, n), torch.where(live, rest_k, k), live
    )
    return core, rest, _Split(positive_, negative_, finite, nan_row, live, top, bottom, count, rest_k)


def plain(scores: torch.Tensor, k: int) -> Extremes:
    """The :class:`Extremes` of all-finite scores: what :func:`extremes` gives them, without the scan."""
    batch, n = scores.shape
    column = torch.ones(batch, 1, dtype=torch.long, device=scores.device)
    return Extremes(
        torch.ones(batch, n, dtype=torch.bool, device=scores.device), 0 * column, n * column, k * column, column.bool()
    )


def assemble(core: torch.Tensor, split: _Split, k: int) -> torch.Tensor:
    """The output by the rule of the module docstring: ``core`` (batch, n) or (batch, n, k), aligned
    with the output's ranks, on the finite entries of live rows; the infinite entries' shares; NaN rows."""
    dtype = core.dtype
    top, bottom, count = (t.to(dtype) for t in (split.top, split.bottom, split.count))
    zero = torch.zeros((), dtype=dtype, device=core.device)
    if core.dim() == 2:
        plus = (k / top.clamp(min=1)).clamp(max=1)  # each +inf: min(1, k/m₊)
        minus = (k - top - count).clamp(min=0) / bottom.clamp(min=1)  # each −inf: the missing mass, shared
        weigh = split.finite & split.live
        out = torch.where(weigh, core, torch.where(split.positive, plus, torch.where(split.negative, minus, zero)))
        return torch.where(split.nan_row, torch.full_like(out, torch.nan), out)
    ranks = torch.arange(k, device=core.device)[None, None, :]
    top3, count3, rest3 = split.top[:, :, None], split.count[:, :, None], split.rest_k[:, :, None]
    plus = torch.where(ranks < top3, 1 / top.clamp(min=1)[:, :, None], zero)  # ranks 1..m₊
    minus = torch.where(ranks >= top3 + count3, 1 / bottom.clamp(min=1)[:, :, None], zero)  # ranks after n_f
    rest_columns = (ranks >= top3) & (ranks < top3 + rest3)
    weigh = (split.finite & split.live)[:, :, None] & rest_columns
    out = torch.where(
        weigh, core, torch.where(split.positive[:, :, None], plus, torch.where(split.negative[:, :, None], minus, zero))
    )
    return torch.where(split.nan_row[:, :, None], torch.full_like(out, torch.nan), out)


class TopKOperator(nn.Module):
    """Base class: a differentiable relaxation of top-k selection (see the module docstring).

    Subclasses implement the core :meth:`_permutation` (then :meth:`soft_topk` is the column sum of
    :meth:`permutation`) and/or :meth:`_soft_topk`; the public methods check the input and apply the
    rules for infinite, NaN and empty input around them. Calling the module is :meth:`soft_topk`.

    ``masks_extremes`` says how a core meets infinite scores. True: the core is vectorised over
    them; it gets the scores with their infinities in place and an :class:`Extremes` (per-row m₊,
    n_f and k'). False: the core only ever sees finite rows and a plain k; rows with an infinite
    (or NaN) score are then grouped by (n_f, k'), their finite entries gathered and the core called
    once per group. That needs one all-finite check per call (a sum, finite unless a score is not or the
    sum overflows, which sends the row down the grouped path with the same answer), a synchronisation on
    a GPU (only these operators pay it there: the sorting networks, whose layout depends on n, and
    SparseTopK, which already synchronises in its solvers). On the CPU every operator makes that
    check and calls its core directly on all-finite scores (the rule changes nothing there).

    While ``torch.compile`` traces, no call reads the data on the host, so that a model around the
    operator compiles as one graph (``fullgraph=True``): a ``masks_extremes`` core always takes the
    vectorised path (the same values and gradients as the direct call on finite scores), and the
    core of any other operator runs on every row at once, with rows holding a non-finite score
    replaced by zeros in its input and given NaN in the output (grouping them by (n_f, k') would
    need their counts on the host). Finite rows get what eager mode gives them.
    """

    gives_permutation = False
    sums_to_k = False
    bounded = True  # every entry of p lies in [0, 1] (NeuralSort, SoftSort: False; see the module docstring)
    sparse = False
    stochastic = False
    masks_extremes = True

    def check(self, scores: torch.Tensor, k: int) -> None:
        """One-line errors for input the operator refuses, before any computation."""
        check_scores(scores, k, type(self).__name__)

    def soft_topk(self, scores: torch.Tensor, k: int | float | torch.Tensor, dim: int = -1) -> torch.Tensor:
        """p, each entry's soft top-k membership, in the shape of ``scores``: the k largest along
        ``dim`` (the other axes are a batch of rows), k an int, a fraction of n, or a tensor of one k per
        row (counts or fractions, broadcast to the rows' shape; the rows are grouped by their count and the
        core called once per group, which a batch-coupled or stochastic core sees as separate calls)."""
        rows, k, shape = as_rows(scores, k, dim, type(self).__name__)
        p = by_k(rows, k, self._soft, columns=False) if isinstance(k, torch.Tensor) else self._soft(rows, k)
        if p.shape == shape and dim in (-1, len(shape) - 1):
            return p  # (batch, n) scores: no view, whose autograd node would cost every call
        return p.reshape(shape).movedim(-1, dim)

    def permutation(self, scores: torch.Tensor, k: int | float | torch.Tensor, dim: int = -1) -> torch.Tensor:
        """P, of shape (..., n, k) (``dim`` moved to the second-last axis): column j the soft
        indicator of the j-th largest entry of each row along ``dim``. With a tensor k (one per row, as
        for :meth:`soft_topk`) there are as many columns as the largest k, and a row's columns beyond its
        own k are 0."""
        if not self.gives_permutation:
            raise ValueError(
                f"{type(self).__name__} gives a soft top-k indicator, not a top-k permutation; "
                "the top-k cross-entropy needs one of the sorting operators (see configs/operator/)"
            )
        rows, k, shape = as_rows(scores, k, dim, type(self).__name__)
        if isinstance(k, torch.Tensor):
            permutation = by_k(rows, k, self._columns, columns=True)
        else:
            permutation = self._columns(rows, k)
        return permutation if len(shape) == 2 else permutation.reshape(*shape, permutation.shape[-1])

    def _soft(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """:meth:`soft_topk` of (batch, n) rows at one k."""
        if type(self)._soft_topk is TopKOperator._soft_topk:
            if not self.gives_permutation:
                raise NotImplementedError(f"{type(self).__name__} must implement _soft_topk")
            return self._guarded(rows, k, self._permutation, columns=True).sum(-1)
        return self._guarded(rows, k, self._soft_topk)

    def _columns(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """:meth:`permutation` of (batch, n) rows at one k."""
        return self._guarded(rows, k, self._permutation, columns=True)

    def forward(self, scores: torch.Tensor, k: int | float, dim: int = -1) -> torch.Tensor:
        return self.soft_topk(scores, k, dim)

    # The cores. ``rest`` is None where every score is finite (k then holds for every row: always so
    # without masks_extremes); otherwise it describes each row (:class:`Extremes`; :func:`plain` gives
    # a core that reads it the all-finite rows' values).
    def _soft_topk(self, scores: torch.Tensor, k: int, rest: Extremes | None) -> torch.Tensor:
        raise NotImplementedError

    def _permutation(self, scores: torch.Tensor, k: int, rest: Extremes | None) -> torch.Tensor:
        raise NotImplementedError

    def _guarded(self, scores: torch.Tensor, k: int, core, columns: bool = False) -> torch.Tensor:
        self.check(scores, k)
        batch, n = scores.shape
        if batch == 0:
            empty = scores * 0
            return empty[:, :, None].expand(batch, n, k).clone() if columns else empty
        compiling = torch.compiler.is_compiling()
        if compiling and not self.masks_extremes:
            return _finite_rows(core, scores, k, columns)
        # All finite: the rule is the identity, so the core alone gives the same result. The check (one sum)
        # is free on the CPU; on a GPU it would synchronise, so there only the grouped operators make it.
        checked = scores.device.type == "cpu" or not self.masks_extremes
        if checked and not compiling and math.isfinite(scores.detach().sum(dtype=SUM_DTYPE.get(scores.dtype))):
            return core(scores, k, None)
        inputs, rest, split = extremes(scores, k)
        if not self.masks_extremes:
            return assemble(_by_groups(core, inputs, split, k, columns), split, k)
        return assemble(core(inputs, k, rest), split, k)


def _finite_rows(core, scores: torch.Tensor, k: int, columns: bool) -> torch.Tensor:
    """The core of a ``masks_extremes = False`` operator on all rows in one call, as ``torch.compile``
    traces it: a row with a non-finite score gets zeros as the core's input and NaN as its output."""
    finite = torch.isfinite(scores).all(1, keepdim=True)
    out = core(torch.where(finite, scores, torch.zeros((), dtype=scores.dtype, device=scores.device)), k, None)
    return torch.where(finite[:, :, None] if columns else finite, out, torch.nan)


def _by_groups(core, inputs: torch.Tensor, split: _Split, k: int, columns: bool) -> torch.Tensor:
    """The core of a ``masks_extremes = False`` operator on each live row's finite entries, rows
    grouped by (n_f, k'), scattered back into place (ranks shifted by m₊ for the permutation)."""
    batch, n = inputs.shape
    zeros = torch.where(split.finite, inputs, 0.0) * 0  # in the graph even where no row is live
    out = zeros[:, :, None].expand(batch, n, k) if columns else zeros
    keys = torch.stack([split.count[:, 0], split.rest_k[:, 0]], dim=1)[split.live[:, 0]]
    for count, rest_k in torch.unique(keys, dim=0).tolist():
        rows = (split.live & (split.count == count) & (split.rest_k == rest_k))[:, 0].nonzero()[:, 0]
        finite = split.finite[rows]
        items = finite.nonzero()[:, 1].view(len(rows), count)  # (g, n_f), in order
        values = core(inputs[rows][finite].view(len(rows), count), rest_k, None)
        if columns:
            ranks = split.top[rows][:, :, None] + torch.arange(rest_k, device=inputs.device)  # (g, 1, k')
            out = out.index_put((rows[:, None, None], items[:, :, None], ranks), values)
        else:
            out = out.index_put((rows[:, None], items), values)
    return out


def hard_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The exact top-k indicator (ties go to the lower index, as ``torch.topk`` breaks them)."""
    return torch.zeros_like(scores).scatter(1, scores.topk(k, dim=1).indices, 1.0)


def hard_permutation(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The exact top-k permutation: ``P[b, i, j]`` = 1 when item i is the (j+1)-th largest."""
    indices = scores.topk(k, dim=1).indices  # (batch, k)
    permutation = scores.new_zeros(*scores.shape, k)
    return permutation.scatter(1, indices[:, None, :], 1.0)
