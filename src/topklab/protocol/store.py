"""Cells on disk: one JSON file per cell, written atomically, so a killed run loses at most the
cell in progress and a rerun skips every cell already stored with the same fingerprint."""
from __future__ import annotations

import json
from pathlib import Path

from topklab.protocol.cell import Cell
from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_write_text


def read_cell(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TopklabError(f"{path} is corrupt ({err}); delete it and rerun to recompute that cell") from err


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True)


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
        return read_cell(path) if path.exists() else None

    def is_done(self, cell: Cell, fingerprint: dict) -> bool:
        """True if ``cell`` is stored with this fingerprint; an error if it is stored with another."""
        record = self.load(cell)
        if record is None:
            return False
        # as JSON text, so that k=1 (one sample) and k=1.0 (the whole batch) differ
        if canonical(record.get("fingerprint")) != canonical(fingerprint):
            raise TopklabError(
                f"{self.path(cell)} was computed with other settings than this run's; "
                f"delete it (or use another preset name / results dir) to recompute"
            )
        return True

    def save(self, record: dict) -> Path:
        cell = Cell(**record["cell"])
        return atomic_write_text(self.path(cell), json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")

    def records(self) -> list[dict]:
        """Every stored cell under the root (for the table builder)."""
        return [read_cell(path) for path in sorted(self.root.glob("*/*/*.json"))]
