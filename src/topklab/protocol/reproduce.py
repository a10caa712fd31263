"""Run the cells of the STk paper's tabular tables (``scripts/reproduce_tabular.py``): each row
file under ``experiments/stk/`` names a table, a dataset, its individual losses and aggregates."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from topklab.protocol.cell import Cell, Protocol, run_cell
from topklab.protocol.grid import Grid
from topklab.protocol.store import CellStore
from topklab.train.run import build
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import collect

ROW_FIELDS = {"table", "dataset", "individual", "aggregates"}


def describe(selected: dict) -> str:
    """``k=0.5, C=100, lr=0.1, delta=0.01``; k prints as given, so 1 (one sample) and 1.0 (all) differ."""
    return ", ".join(f"{name}={value if name == 'k' else format(value, 'g')}"
                     for name, value in selected.items() if name != "index")


def load_rows(experiments_dir: Path, rows) -> list[DictConfig]:
    """The row configs named by ``rows`` ("all" or a list of ``table3/australian``-style names)."""
    available = {p.relative_to(experiments_dir).with_suffix("").as_posix(): p
                 for p in sorted(experiments_dir.glob("*/*.yaml"))}
    if not available:
        raise TopklabError(f"no row configs under {experiments_dir}; run from the repository root")
    names = list(available) if rows == "all" else [rows] if isinstance(rows, str) else list(rows)
    out = []
    for name in names:
        if name not in available:
            raise TopklabError(f"unknown row {name!r}; choose from: {', '.join(available)} (or all)")
        row = OmegaConf.load(available[name])
        missing = ROW_FIELDS - set(row)
        if missing:
            raise TopklabError(f"{available[name]}: missing field(s) {', '.join(sorted(missing))}")
        out.append(row)
    return out


def protocol_from(preset: DictConfig) -> Protocol:
    fields = OmegaConf.to_container(preset, resolve=True)
    missing = {"name", "grid"} - set(fields)
    if missing:
        raise TopklabError(f"preset lacks {', '.join(sorted(missing))}; start from configs/preset/full.yaml")
    fields.pop("name")
    try:
        return Protocol(grid=Grid(**fields.pop("grid")), **fields)
    except TypeError as err:
        raise TopklabError(f"preset: {err}") from None


def as_list(value) -> list | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def group_config(config_dir: Path, group: str, option: str, paths: DictConfig) -> DictConfig:
    path = config_dir / group / f"{option}.yaml"
    if not path.exists():
        choices = ", ".join(sorted(p.stem for p in (config_dir / group).glob("*.yaml")))
        raise TopklabError(f"unknown {group} {option!r}; choose one of: {choices}")
    node = OmegaConf.load(path)
    node.pop("defaults", None)
    return OmegaConf.merge({"paths": paths}, {group: node})[group]


def reproduce(cfg: DictConfig) -> list[dict]:
    """Train every cell of the selected rows that the results directory lacks; return all records
    of the selected rows (stored or new)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    config_dir = Path(cfg.config_dir)
    protocol = protocol_from(cfg.preset)
    store = CellStore(cfg.results_dir)
    plan = []  # (cell, dataset config, individual config, fingerprint extras)
    for row in load_rows(Path(cfg.experiments_dir), cfg.row):
        dataset_cfg = group_config(config_dir, "dataset", row.dataset, cfg.paths)
        wanted = as_list(cfg.aggregates)
        aggregates = [a for a in row.aggregates if wanted is None or a in wanted]
        for individual in row.individual:
            individual_cfg = group_config(config_dir, "individual", individual, cfg.paths)
            for aggregate in aggregates:
                cell = Cell(row.table, row.dataset, individual, aggregate)
                protocol.grid.combos(aggregate)  # unknown aggregate names fail before any training
                # unresolved, so that machine-specific paths do not enter the fingerprint
                settings = {"dataset": OmegaConf.to_container(dataset_cfg, resolve=False),
                            "individual": OmegaConf.to_container(individual_cfg, resolve=False)}
                plan.append((cell, dataset_cfg, individual_cfg, settings))

    unused = set(as_list(cfg.aggregates) or []) - {c.aggregate for c, *_ in plan}
    if unused:
        raise TopklabError(f"aggregates {sorted(unused)} are in none of the selected rows; choose from the rows' "
                           f"aggregates ({', '.join(sorted({c.aggregate for c, *_ in plan}))})")

    def fingerprint(cell, settings):
        return {"protocol": protocol.fingerprint(cell.aggregate), **settings}

    todo = [p for p in plan if not store.is_done(p[0], fingerprint(p[0], p[3]))]
    trainings = sum(len(protocol.grid.combos(c.aggregate)) * protocol.n_splits for c, *_ in todo)
    print(f"{len(plan) - len(todo)} of {len(plan)} cells already in {store.root}; "
          f"{len(todo)} to train ({trainings} trainings)")
    provenance = collect(cfg.paths.root_dir) if todo else None
    command = " ".join(["python", *sys.argv])
    with tqdm(total=trainings, unit="training", disable=not cfg.progress, smoothing=0.05) as bar:
        for cell, dataset_cfg, individual_cfg, settings in todo:
            bar.set_description(cell.key)
            dataset = build(dataset_cfg, "dataset")
            individual = build(individual_cfg, "individual")
            record = run_cell(cell, dataset, individual, protocol, settings=settings, on_retire=bar.update)
            record["preset"] = cfg.preset.name
            record["command"] = command
            record["provenance"] = provenance
            store.save(record)
            bar.write(f"{cell.key}: test {record['metric']} {record['test_mean']:.4g} ± {record['test_std']:.3g} "
                      f"(selected {describe(record['selected'])}; {record['seconds']:.0f} s)")
    return [store.load(cell) for cell, *_ in plan]
