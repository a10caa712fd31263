"""Cells on disk: one result file per cell (the envelope of :mod:`topklab.report.schema`, family
"tabular"), written atomically, so a killed run loses at most the cell in progress and a rerun skips
every cell already stored with the same fingerprint (and, under other training source, the same
replay: :mod:`topklab.protocol.replay`).

In memory a cell is the flat record of :func:`topklab.protocol.cell.run_cell` plus ``command``,
``provenance`` and ``preset``; on disk its ``fingerprint`` is the envelope's ``config`` and the rest
of the record its ``result``."""

from __future__ import annotations

import json
from pathlib import Path

from topklab.protocol.cell import COMMITTED_LOSS, Cell
from topklab.report.schema import make_result, read_result, write_result
from topklab.utils.errors import TopklabError

ENVELOPE_KEYS = ("fingerprint", "command", "provenance")  # the record's keys that the envelope holds


def to_result(record: dict) -> dict:
    """The envelope of a cell record.

    Examples
    --------
    >>> record = {"cell": {"table": "table3", "dataset": "d", "individual": "logistic", "aggregate": "stk"},
    ...           "fingerprint": {"protocol": {}}, "command": "python x", "provenance": {}, "metric": "error_pct",
    ...           "selected": {}, "test_mean": 1.0, "test_std": 0.0, "per_split": {}, "combos": {}, "preset": "p"}
    >>> result = to_result(record)
    >>> result["experiment"], result["config"], from_result(result) == record
    ('table3/d/logistic/stk', {'protocol': {}}, True)
    """
    missing = [k for k in ("cell", *ENVELOPE_KEYS) if k not in record]
    if missing:
        raise TopklabError(f"a cell record needs {missing} before it is stored; set them as protocol.reproduce does")
    payload = {k: v for k, v in record.items() if k not in ENVELOPE_KEYS}
    return make_result(
        "tabular",
        Cell(**record["cell"]).key,
        payload,
        command=record["command"],
        config=record["fingerprint"],
        provenance=record["provenance"],
    )


def from_result(result: dict) -> dict:
    """The cell record of an envelope (inverse of :func:`to_result`)."""
    return {
        **result["result"],
        "fingerprint": result["config"],
        "command": result["command"],
        "provenance": result["provenance"],
    }


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True)


def with_defaults(fingerprint: dict, cell: Cell) -> dict:
    """A stored fingerprint with the fields it predates at their defaults: ``loss`` (the members'
    loss config) at :data:`~topklab.protocol.cell.COMMITTED_LOSS`, what the cells stored before it ran.

    Examples
    --------
    >>> with_defaults({"protocol": {}}, Cell("table3", "d", "logistic", "average"))["loss"]
    {'_target_': 'topklab.losses.Average'}
    """
    return fingerprint if "loss" in fingerprint else {**fingerprint, "loss": COMMITTED_LOSS[cell.aggregate]}


class CellStore:
    """``<root>/<table>/<dataset>/<individual>-<aggregate>.json`` under one preset's directory.

    Examples
    --------
    >>> store = CellStore("results/tabular/quick")              # doctest: +SKIP
    >>> store.load(Cell("table3", "australian", "logistic", "stk"))["test_mean"]  # doctest: +SKIP
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, cell: Cell) -> Path:
        return self.root / cell.table / cell.dataset / f"{cell.individual}-{cell.aggregate}.json"

    def load(self, cell: Cell) -> dict | None:
        path = self.path(cell)
        return from_result(read_result(path, "tabular")) if path.exists() else None

    def is_done(self, cell: Cell, fingerprint: dict) -> bool:
        """True if ``cell`` is stored with this fingerprint (:func:`with_defaults`); an error if it
        is stored with another."""
        record = self.load(cell)
        if record is None:
            return False
        # as JSON text, so that k=1 (one sample) and k=1.0 (the whole batch) differ
        if canonical(with_defaults(record["fingerprint"], cell)) != canonical(fingerprint):
            raise TopklabError(
                f"{self.path(cell)} was computed with other settings than this run's; "
                f"delete it (or use another preset name / results dir) to recompute"
            )
        return True

    def save(self, record: dict) -> Path:
        """Store a cell record (with ``command``, ``provenance`` and ``fingerprint``) as one compact line."""
        return write_result(self.path(Cell(**record["cell"])), to_result(record), indent=None)
