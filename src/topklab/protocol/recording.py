"""The losses a tabular cell's selected setting trains on, recorded call by call (one split), with
the λ each call used: how :mod:`topklab.losses.aggregate.loss_stream` measures whether the paper's
update kept λ in band in the committed tables."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.utils import instantiate

from topklab.config import compose_run
from topklab.engine.aggregates import aggregate_node
from topklab.engine.build import build
from topklab.losses.aggregate.loss_stream import LossStream, record_calls
from topklab.protocol.cell import Cell, Protocol, run_cell
from topklab.protocol.grid import Grid


def record_cell(cell_file: Path, root: Path) -> LossStream:
    """Train a stored cell's selected setting (``result.selected``) on split 0 with the cell's own
    protocol (its stored fingerprint), row, dataset and individual (Hydra must be initialised),
    recording its training calls."""
    stored = json.loads(Path(cell_file).read_text())
    result = stored["result"]
    fields = {k: v for k, v in stored["config"]["protocol"].items() if k != "grid"}
    selected = result["selected"]
    protocol = Protocol(
        **{**fields, "n_splits": 1},
        grid=Grid(k=[selected["k"]], C=[selected["C"]], lr=[selected["lr"]], delta=[selected["delta"]]),
    )
    cell = Cell(**result["cell"])
    cfg = compose_run(
        [f"experiment=stk/{cell.table}/{cell.dataset}", f"individual={cell.individual}", f"loss={cell.aggregate}"]
    )
    dataset, individual = build(cfg.dataset, "dataset"), build(cfg.individual, "individual")
    stream = LossStream(
        source={
            "cell": str(Path(cell_file).relative_to(root)),
            "split": 0,
            "setting": {key: selected[key] for key in ("k", "C", "lr", "delta")},
            "optimizer": "adagrad",
            "lam_init": protocol.lam_init,
            "aggregate": cell.aggregate,
        }
    )
    aggregate = record_calls(instantiate(protocol.members_aggregate(aggregate_node(cell.aggregate))), stream)
    run_cell(cell, dataset, individual, protocol, aggregate=aggregate)
    return stream
