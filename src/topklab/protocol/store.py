"""Cells on disk: one result file per cell (the envelope of :mod:`topklab.report.schema`, family
"tabular"), written atomically, so a killed run loses at most the cell in progress and a rerun skips
every cell already stored with the same fingerprint and identity (:func:`stored_cell_identity`).

In memory a cell is the flat record of :func:`topklab.protocol.cell.run_cell` plus ``command``,
``provenance`` and ``preset``; on disk its ``fingerprint`` is the envelope's ``config`` and the rest
of the record its ``result``."""

from __future__ import annotations

import json
from pathlib import Path

from topklab.engine.result_guard import differing_keys
from topklab.engine.run_identity import UNRECORDED, identity_differences
from topklab.protocol.cell import COMMITTED_LOSS, THRESHOLD_DIAGNOSTICS, Cell
from topklab.report.schema import make_result, read_result, write_result
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import NUMERICS_PACKAGES, cpu_isa

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

    def stored(self, cell: Cell, force: bool = False) -> dict | None:
        """The stored record of ``cell``; None where none is. A corrupt one is a one-line error, or under
        ``force`` (which replaces it) ``{"unreadable": why}``."""
        try:
            return self.load(cell)
        except TopklabError as err:
            if force:
                return {"unreadable": str(err)}
            raise TopklabError(f"{err}; or pass force_result=true to replace it") from None

    def differences(self, record: dict, cell: Cell, fingerprint: dict, mine: dict) -> list[str]:
        """What differs between a stored cell ``record`` and this run: its fingerprint (the protocol and the
        members' configs, compared as JSON text so that k=1, one sample, and k=1.0, the whole batch, differ;
        a field it predates under :func:`with_defaults`), key by key, then its identity
        (:func:`stored_cell_identity`)."""
        if "unreadable" in record:
            return [f"unreadable ({record['unreadable']})"]
        old, new = (json.loads(canonical(f)) for f in (with_defaults(record["fingerprint"], cell), fingerprint))
        keys = [] if canonical(old) == canonical(new) else differing_keys(old, new) or ["fingerprint"]
        config = [f"config {key}" for key in keys[:3]] + (
            [f"{len(keys) - 3} more config keys"] if len(keys) > 3 else []
        )
        return identity_differences(stored_cell_identity(record), mine) + config

    def save(self, record: dict) -> Path:
        """Store a cell record (with ``command``, ``provenance`` and ``fingerprint``) as one compact line."""
        return write_result(self.path(Cell(**record["cell"])), to_result(record), indent=None)


def stored_cell_identity(record: dict) -> dict:
    """The identity (:func:`~topklab.engine.run_identity.identity`) a stored cell record was computed
    under: its ``identity``, or for a cell stored before that field, what its provenance and replay
    recorded (the training source as its replay's ``code``, torch, threads, CPU kernels and numerics
    variables where recorded, on the CPU); a field neither holds is unrecorded, and such a cell is
    reused by no run."""
    if "identity" in record:
        return record["identity"]
    provenance = record.get("provenance") or {}
    hardware, packages = provenance.get("hardware", {}), provenance.get("packages") or {}
    legacy = {
        "code": (record.get("replay") or {}).get("code"),
        "python": provenance.get("python"),
        "torch": packages.get("torch"),
        "packages": {name: packages.get(name, UNRECORDED) for name in NUMERICS_PACKAGES} if packages else None,
        "device": "cpu",
        "threads": hardware.get("torch_threads"),
        "cpu_capability": hardware.get("torch_cpu_capability"),
        "cpu_isa": cpu_isa(hardware["cpu_flags"]) if hardware.get("cpu_flags") is not None else None,
        "environment": hardware.get("numerics_environment"),
    }
    return {field: value for field, value in legacy.items() if value is not None}


def replaced_cell(record: dict) -> dict:
    """What a forced cell replaces: the stored cell's identity, selected setting, test numbers and commit
    (or why it could not be read)."""
    if "unreadable" in record:
        return {"unreadable": record["unreadable"]}
    return {
        "identity": stored_cell_identity(record),
        "selected": record.get("selected"),
        "test_mean": record.get("test_mean"),
        "test": (record.get("per_split") or {}).get("test"),
        "git": (record.get("provenance") or {}).get("git"),
    }


def _same_splits(old: dict, new: dict) -> bool:
    """Whether two cell records hold the same per-split numbers, bit for bit; λ's diagnostics
    (:data:`~topklab.protocol.cell.THRESHOLD_DIAGNOSTICS`) count only where the stored record has them
    (a cell stored before they were recorded is compared on the rest)."""
    kept = {k: v for k, v in new["per_split"].items() if k in old["per_split"] or k not in THRESHOLD_DIAGNOSTICS}
    return canonical(old["per_split"]) == canonical(kept)


def compare_cells(pairs: list[tuple[dict, dict]]) -> str:
    """One line over ``(stored, retrained)`` cell records: which retrained cells reproduce their stored
    per-split numbers (test, validation and training metric, steps, λ) bit for bit, and how the others'
    test means and selected settings differ.

    Examples
    --------
    >>> a = {"cell": {"table": "t", "dataset": "d", "individual": "i", "aggregate": "stk"}, "test_mean": 1.0,
    ...      "per_split": {"test": [1.0]}, "selected": {"index": 0}}
    >>> compare_cells([(a, a), (a, {**a, "test_mean": 2.0, "per_split": {"test": [2.0]}})])
    'reproduced bit for bit: 1 of 2 (t/d/i/stk); differ: t/d/i/stk test 1 → 2 (selected index 0 → 0)'
    """
    same = [new for old, new in pairs if _same_splits(old, new)]
    differ = [
        f"{Cell(**new['cell']).key} test {old['test_mean']:.6g} → {new['test_mean']:.6g} "
        f"(selected index {old['selected']['index']} → {new['selected']['index']})"
        for old, new in pairs
        if not _same_splits(old, new)
    ]
    return (
        f"reproduced bit for bit: {len(same)} of {len(pairs)}"
        + (f" ({', '.join(Cell(**r['cell']).key for r in same)})" if same else "")
        + (f"; differ: {'; '.join(differ)}" if differ else "")
    )
