"""A cell's replay: the first training steps of its selected combination, as a digest that a later
version of the training source must reproduce bit for bit before it reuses the cell.

This module uses only what every commit that stored a committed cell has (:class:`Protocol`,
:class:`Grid`, :func:`run_cell`), so that ``scripts/record_cell_replays.py`` can replay a cell under
the source it was trained with."""

from __future__ import annotations

import dataclasses
import hashlib

from torch import nn

from topklab.protocol.cell import Cell, Protocol, run_cell
from topklab.protocol.grid import Grid

REPLAY_STEPS = 4  # training calls replayed: the first one's losses and those after three updates


class _Replayed(Exception):
    """Raised by the recording hook once the replayed steps are in: it ends the training early."""


def replay(
    cell: Cell, dataset, individual: nn.Module, protocol: Protocol, selected: dict, aggregate: nn.Module | None = None
) -> str:
    """16 hex digits over the per-sample training losses of the first :data:`REPLAY_STEPS` training
    calls of ``selected`` (a cell's ``selected`` combination) on split 0 under ``protocol``. They
    hold the initial model, the split, the batch order and, from the second call on, every update
    (aggregate, gradient, L2 penalty, optimizer). ``aggregate`` is the members' aggregate module, as
    training passes it to :func:`run_cell` (None: run_cell's default).
    """
    grid = Grid(**{axis: [selected[axis]] for axis in ("k", "C", "lr", "delta")})
    digest, calls = hashlib.sha256(), []

    def record(module, inputs, losses):
        digest.update(losses.detach().double().contiguous().numpy().tobytes())
        calls.append(None)
        if len(calls) == REPLAY_STEPS:
            raise _Replayed

    hook = individual.register_forward_hook(record)
    try:
        protocol = dataclasses.replace(protocol, n_splits=1, grid=grid)
        run_cell(cell, dataset, individual, protocol, **({} if aggregate is None else {"aggregate": aggregate}))
    except _Replayed:
        pass
    finally:
        hook.remove()
    return digest.hexdigest()[:16]
