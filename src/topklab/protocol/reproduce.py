"""Run the cells of the STk paper's tabular tables (``train.py experiment=<row>`` through
:class:`TabularCells`; ``scripts/reproduce_tabular.py`` is an alias of that command): rows × columns × grid × splits →
population executor → selection → cell store. Each row is an
``experiment=stk/table<N>/<dataset>`` config whose ``cells`` name the table and its columns
(individual losses × aggregates); every cell's config is composed by Hydra from the row and the
column, so the dataset, individual loss and aggregate are exactly what ``train.py`` would build.
Needs an initialised Hydra (an ``@hydra.main`` app, or ``initialize_config_dir`` in tests)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from topklab.config import check_one_process_command, compose_run, config_groups
from topklab.data.fingerprint import dataset_fingerprint
from topklab.engine.build import build
from topklab.engine.result_guard import refusal
from topklab.engine.run_identity import identity
from topklab.protocol.cell import Cell, Protocol, run_cell
from topklab.protocol.grid import Grid
from topklab.protocol.store import CellStore, compare_cells, replaced_cell
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import check_cpu_capability, collect


def describe(selected: dict) -> str:
    """``k=0.5, C=100, lr=0.1, delta=0.01``; k prints as given, so 1 (one sample) and 1.0 (all) differ."""
    return ", ".join(
        f"{name}={value if name == 'k' else format(value, 'g')}" for name, value in selected.items() if name != "index"
    )


TABULAR_TABLES = ("stk/table3/", "stk/table4/", "stk/table6/")


def tabular_rows(config_dir: Path) -> list[str]:
    """The tabular paper rows: ``experiment`` options of Tables 3, 4 and 6 (each lists its cells)."""
    return [row for row in config_groups(config_dir)["experiment"] if row.startswith(TABULAR_TABLES)]


def select_rows(config_dir: Path, rows) -> list[str]:
    """The rows named by ``rows`` ("all", one ``stk/table3/australian`` id, or a list of them)."""
    available = tabular_rows(config_dir)
    names = available if rows == "all" else [rows] if isinstance(rows, str) else list(rows)
    for name in names:
        if name not in available:
            raise TopklabError(f"unknown row {name!r}; choose from: {', '.join(available)} (or all)")
    return names


def protocol_from(preset: DictConfig) -> Protocol:
    fields = OmegaConf.to_container(preset, resolve=True)
    missing = {"name", "grid"} - set(fields)
    if missing:
        raise TopklabError(f"preset lacks {', '.join(sorted(missing))}; start from configs/preset/full.yaml")
    fields.pop("name")
    fields.pop("check_stored", None)  # what a run does with cells stored under another identity: not the protocol
    try:
        return Protocol(grid=Grid(**fields.pop("grid")), **fields)
    except TypeError as err:
        raise TopklabError(f"preset: {err}") from None


def as_list(value) -> list | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def members(cell_cfg: DictConfig, protocol: Protocol) -> tuple:
    """``(dataset, individual, aggregate)``: fresh modules of a cell as its members train them."""
    return (
        build(cell_cfg.dataset, "dataset"),
        build(cell_cfg.individual, "individual"),
        build(protocol.members_aggregate(cell_cfg.loss), "loss"),
    )


def reproduce(cfg: DictConfig) -> list[dict]:
    """Train every cell of the selected rows that the results directory lacks; return all records of
    the selected rows (stored or new).

    A stored cell is reused only under this run's fingerprint (the protocol and the members' configs:
    otherwise a one-line error) and identity (:func:`~topklab.engine.run_identity.identity`: the
    training source, torch, the CPU kernels, threads, numerics variables and the data's digest). Cells
    stored under another identity are refused in one line before any training, unless ``cfg.check``
    (trains them into ``cfg.check_dir`` and ends by comparing each with the stored one) or
    ``cfg.force`` (replaces them, each new cell recording what it replaced)."""
    check_cpu_capability(cfg.get("cpu_capability"))
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    protocol = protocol_from(cfg.preset)
    store = CellStore(cfg.results_dir)
    wanted, wanted_individuals = as_list(cfg.aggregates), as_list(cfg.get("individuals"))
    paths = [f"paths.{k}={v}" for k, v in OmegaConf.to_container(cfg.paths, resolve=True).items()]
    plan = []  # (cell, composed config of the cell, fingerprint extras, identity)
    offered = {"aggregates": set(), "individuals": set()}
    for row in select_rows(Path(cfg.config_dir), cfg.row):
        cells = compose_run([f"experiment={row}", *paths]).cells
        offered["aggregates"].update(cells.loss)
        offered["individuals"].update(cells.individual)
        for individual in (i for i in cells.individual if wanted_individuals is None or i in wanted_individuals):
            for aggregate in (a for a in cells.loss if wanted is None or a in wanted):
                cell_cfg = compose_run([f"experiment={row}", f"individual={individual}", f"loss={aggregate}", *paths])
                cell = Cell(cells.table, cell_cfg.row, individual, aggregate)
                protocol.grid.combos(aggregate)  # unknown aggregate names fail before any training
                # unresolved, so that machine-specific paths do not enter the fingerprint
                settings = {
                    "dataset": OmegaConf.to_container(cell_cfg.dataset, resolve=False),
                    "individual": OmegaConf.to_container(cell_cfg.individual, resolve=False),
                    "loss": OmegaConf.to_container(protocol.members_aggregate(cell_cfg.loss), resolve=True),
                }
                mine = identity(torch.device("cpu"), dataset_fingerprint(build(cell_cfg.dataset, "dataset")))
                mine["world_size"] = 1  # a cell trains in one process, whatever launched it
                plan.append((cell, cell_cfg, settings, mine))

    for key, asked in (("aggregates", wanted), ("individuals", wanted_individuals)):
        if set(asked or []) - offered[key]:
            raise TopklabError(
                f"{key} {sorted(set(asked) - offered[key])} are in none of the selected rows; choose "
                f"from the rows' {key} ({', '.join(sorted(offered[key]))})"
            )

    def fingerprint(cell, settings):
        return {"protocol": protocol.fingerprint(cell.aggregate), **settings}

    force = bool(cfg.get("force"))
    check_all = bool(cfg.get("check_all")) and not force  # check_result=true: every stored cell, equal or not
    stored = {cell.key: store.stored(cell, force) for cell, *_ in plan}
    differing = {
        cell.key: differences
        for cell, _, settings, mine in plan
        if stored[cell.key] is not None
        and ((differences := store.differences(stored[cell.key], cell, fingerprint(cell, settings), mine)) or check_all)
    }
    checked = CellStore(cfg.check_dir) if differing and not force and (cfg.get("check") or check_all) else None
    if differing and not force:
        first, reasons = next(iter(differing.items()))
        reasons = reasons or ["none: checked as asked"]
        if checked is None:
            refused = refusal(store.path(Cell(*first.split("/"))), reasons)
            raise TopklabError(f"{len(differing)} of {len(plan)} stored cells differ: {refused}")
        print(
            f"{len(differing)} of {len(plan)} cells in {store.root} were stored under other settings "
            f"({'; '.join(reasons)}); training them into {checked.root} to compare"
        )
    todo = [p for p in plan if stored[p[0].key] is None or p[0].key in differing]

    def target(cell: Cell) -> CellStore:
        return checked if checked is not None and cell.key in differing else store

    trainings = sum(len(protocol.grid.combos(c.aggregate)) * protocol.n_splits for c, *_ in todo)
    print(
        f"{len(plan) - len(todo)} of {len(plan)} cells already in {store.root}; "
        f"{len(todo)} to train ({trainings} trainings)"
    )
    provenance = collect(cfg.paths.root_dir) if todo else None
    command = cfg.get("command") or " ".join(["python", *sys.argv])
    with tqdm(total=trainings, unit="training", disable=not cfg.progress, smoothing=0.05) as bar:
        for cell, cell_cfg, settings, mine in todo:
            bar.set_description(cell.key)
            dataset, individual, aggregate = members(cell_cfg, protocol)
            record = run_cell(
                cell, dataset, individual, protocol, settings=settings, on_retire=bar.update, aggregate=aggregate
            )
            if cell.key in differing and force:
                record["replaced"] = replaced_cell(stored[cell.key])
            record["identity"] = mine
            record["preset"] = cfg.preset.name
            record["command"] = command
            record["provenance"] = provenance
            target(cell).save(record)
            bar.write(
                f"{cell.key}: test {record['metric']} {record['test_mean']:.4g} ± {record['test_std']:.3g} "
                f"(selected {describe(record['selected'])}; {record['seconds']:.0f} s)"
            )
    if checked is not None:
        print(compare_cells([(stored[c.key], checked.load(c)) for c, *_ in plan if c.key in differing]))
    return [target(cell).load(cell) for cell, *_ in plan]


CELLS_OWN_KEYS = (
    "experiment",
    "preset",
    "runner",
    "paths",
    "hydra",
    "cpu_capability",
    "force_result",
    "check_result",
    "logger",
)  # overrides the cells honour (experiment, preset, runner, cpu_capability, force_result, check_result) or that do not touch them


@dataclass
class TabularCells:
    """``runner=tabular_cells``: ``python train.py experiment=stk/table3/<dataset> [preset=full]`` runs
    that row by the paper's protocol: every cell
    (individual × aggregate) over the preset's grid × splits, stored one JSON per cell.

    Parameters
    ----------
    aggregates, individuals : list of str or None
        The row's cells to run (None: all of them).
    results_dir : str or None
        Where the cells are stored. None: ``results/tabular/<preset name>``, or the run's directory
        for a run that changes a preset field on the command line, so that a trial never replaces a
        committed cell.
    threads : int >= 0
        torch threads (0: torch's default).
    progress : bool
        A tqdm bar over the trainings.

    Examples
    --------
    >>> TabularCells(aggregates=["stk"]).aggregates
    ['stk']
    """

    aggregates: list[str] | None = None
    individuals: list[str] | None = None
    results_dir: str | None = None
    threads: int = 0
    progress: bool = True

    def check(self, cfg: DictConfig, overrides: list[str], experiment: str | None = None) -> None:
        """A one-line :class:`TopklabError` for a command line this runner cannot honour: no tabular
        row, no preset, or an override that would not reach the cells (train.py checks before Hydra)."""
        if experiment not in tabular_rows(Path(cfg.paths.root_dir) / "configs"):
            raise TopklabError(
                f"runner=tabular_cells runs a row of Tables 3, 4 and 6 (experiment=stk/table3/<dataset> ...), "
                f"not {experiment or 'a run without experiment='}; use runner=model for one model"
            )
        if cfg.get("preset") is None:
            raise TopklabError("runner=tabular_cells needs a protocol: preset=quick | full | fraction")
        protocol_from(cfg.preset)
        check_one_process_command(
            "tabular_cells",
            overrides,
            CELLS_OWN_KEYS,
            "does not reach the cells: each is composed from the row and the preset; change a preset field "
            "(preset.<field>=) or the row's yaml, or train one model with runner=model",
        )

    def __call__(self, cfg: DictConfig, run_dir, job_name=None, overrides=None, experiment=None) -> None:
        overrides = list(overrides or [])
        self.check(cfg, overrides, experiment)
        trial = any(o.lstrip("+~").startswith("preset.") for o in overrides)  # a changed field, not a named preset
        committed = Path(cfg.paths.root_dir) / "results" / "tabular" / cfg.preset.name
        setup = OmegaConf.create(
            {
                "row": experiment,
                "command": " ".join(["python train.py", *overrides]),  # Hydra's task overrides name the row
                "preset": OmegaConf.to_container(cfg.preset, resolve=True),
                "results_dir": self.results_dir or str(Path(run_dir) / "cells" if trial else committed),
                "aggregates": self.aggregates,
                "individuals": self.individuals,
                "threads": self.threads,
                "progress": self.progress,
                "paths": OmegaConf.to_container(cfg.paths, resolve=True),
                "config_dir": str(Path(cfg.paths.root_dir) / "configs"),
                "cpu_capability": cfg.get("cpu_capability"),
                "force": bool(cfg.get("force_result")),
                "check": bool(cfg.preset.get("check_stored") if cfg.get("check_result") is None else cfg.check_result),
                "check_all": cfg.get("check_result") is True,
                "check_dir": str(Path(run_dir) / "cells"),
            }
        )
        records = reproduce(setup)
        aside = Path(setup.check_dir)
        where = f"{setup.results_dir}" + (f" and {aside} (checked)" if aside.exists() else "")
        print(f"{len(records)} cells of {experiment} in {where}; `make tables` renders {setup.results_dir}")
