"""How the population executor lays its members out in memory (rows of every member tensor).

Both layouts give every member the same mini-batches, model and update; they differ in which
batched products run and in what happens to a member that stops, hence in speed and in float
rounding (not in what is computed):

- :class:`Gathered`: each row gathers its own copy of its batch (P, B, d) and runs its own small
  GEMM; a member that stops leaves the rows (retires), so it costs nothing more. Right for narrow
  inputs and members that stop at very different times (the tabular grid: d ≈ 10, B = 16).
- :class:`Grouped`: rows are grouped by (split, seed), M members per group; one (G, B, d) batch
  feeds all G·M members through a batched matmul, nothing is copied per member. A member that
  stops is frozen at its best state while its row keeps computing. Right for wide inputs where a
  per-member copy of the batch would cost more (the synthetic task: d = 200, B = 512).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from topklab.engine.stacked import StackedModel
from topklab.utils.errors import TopklabError


class Gathered:
    """Rows = the members still training, in member order; stopped members retire.

    Parameters
    ----------
    model : StackedModel
    split, pair : LongTensor (P,), each member's data group and its (split, seed) pair index
    chunk : int, most members evaluated in one call
    """

    compacts = True

    def __init__(self, model: StackedModel, split: torch.Tensor, pair: torch.Tensor, chunk: int):
        self.model, self.split, self.pair, self.chunk = model, split, pair, chunk
        self.rows = torch.arange(len(split))

    def train_outputs(
        self, params: dict, rows: torch.Tensor, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs (..., B, 1) and targets (broadcastable to the outputs' (..., B)) of rows ``rows``
        on their batch: positions ``positions[pair]`` (one row of positions per pair) of their split
        of x (S, n, d), y (S, n); the leading dimensions flatten to the rows. Here (R, B, 1), (R, B)."""
        xb, yb = _batch(x, y, self.split[rows][:, None], positions[self.pair[rows]])
        return self.model.gathered(params, xb), yb

    def reduce(self, params: dict, rows: torch.Tensor, x: torch.Tensor, y: torch.Tensor, fn: Callable) -> torch.Tensor:
        """``fn(outputs (..., n, 1), targets (broadcastable to (..., n)), idx) -> (...)`` on whole
        splits, for chunks ``idx`` of the rows (positions in ``rows``; the leading dimensions flatten
        to them); returns (R,) float64. Here the chunks are (c, n, 1) with targets (n,)."""
        out = torch.empty(len(rows), dtype=torch.float64)
        member_split = self.split[rows]
        with torch.no_grad():
            for s in torch.unique(member_split).tolist():
                for idx in torch.nonzero(member_split == s).flatten().split(self.chunk):
                    outputs = self.model.shared({name: t[idx] for name, t in params.items()}, x[s])
                    out[idx] = fn(outputs, y[s], idx).double()
        return out


class Grouped:
    """Rows = all members, grouped by (split, seed) pair; stopped members stay (frozen).

    Parameters as :class:`Gathered`; every pair must hold the same number of members.

    Examples
    --------
    >>> from topklab.engine.stacked import StackedLinear
    >>> layout = Grouped(StackedLinear(2), split=torch.tensor([1, 0, 1, 0]), pair=torch.tensor([1, 0, 1, 0]), chunk=8)
    >>> layout.rows.tolist(), layout.group_split.tolist(), layout.per_group  # rows 0-1 share split 0's batch
    ([1, 3, 0, 2], [0, 1], 2)
    """

    compacts = False

    def __init__(self, model: StackedModel, split: torch.Tensor, pair: torch.Tensor, chunk: int):
        sizes = torch.bincount(pair)
        if not bool((sizes == sizes[0]).all()):
            raise TopklabError(
                f"the grouped layout needs the same number of members for every (split, seed); got "
                f"{sorted(set(sizes.tolist()))}; use the gathered layout"
            )
        self.model, self.chunk = model, chunk
        self.per_group = int(sizes[0])
        self.rows = torch.argsort(pair, stable=True)
        self.group_split = split[self.rows[:: self.per_group]]
        self._where = self.group_split[:, None]

    def train_outputs(self, params, rows, x, y, positions):
        """As :meth:`Gathered.train_outputs` with outputs (G, M, B, 1) and targets (G, 1, B); ``rows``
        are always all members here."""
        xb, yb = _batch(x, y, self._where, positions)
        return self.model.grouped(params, xb).view(len(xb), self.per_group, *xb.shape[1:2], 1), yb[:, None, :]

    def reduce(self, params, rows, x, y, fn):
        """As :meth:`Gathered.reduce`, in blocks of whole groups: outputs (g, M, n, 1), targets
        (g, 1, n), ``idx`` a slice of rows."""
        groups = len(self.group_split)
        step = max(1, self.chunk // self.per_group)
        out = []
        with torch.no_grad():
            for first in range(0, groups, step):
                block = slice(first, min(first + step, groups))
                idx = slice(block.start * self.per_group, block.stop * self.per_group)
                where = self.group_split[block]
                outputs = self.model.grouped({name: t[idx] for name, t in params.items()}, _take(x, where))
                outputs = outputs.view(len(where), self.per_group, x.shape[1], 1)
                out.append(fn(outputs, _take(y, where)[:, None, :], idx).double().reshape(-1))
        return torch.cat(out)


def _batch(
    x: torch.Tensor, y: torch.Tensor, where: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x[where, positions]`` (R, B, d) and ``y[where, positions]`` (R, B) for x (S, n, d), y (S, n):
    one ``index_select`` on the flattened rows, a few times faster than advanced indexing."""
    index = (where * x.shape[1] + positions).flatten()
    return (
        x.flatten(0, 1).index_select(0, index).view(*positions.shape, x.shape[2]),
        y.flatten().index_select(0, index).view(positions.shape),
    )


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]``, as a view when ``index`` is a run of consecutive indices (no copy of the data)."""
    first = int(index[0])
    if torch.equal(index, torch.arange(first, first + len(index))):
        return x[first : first + len(index)]
    return x[index]
