"""The rows with committed results keep composing the loss they ran: a default that moves (here MATk/STk's
``compile_min_n``, the library's C++ kernel at every n on a CPU) must not move them."""

import json
import re

import torch
from omegaconf import OmegaConf

from helpers import ROOT
from topklab.config import config_groups
from topklab.protocol.cell import COMMITTED_COMPILE_MIN_N
from topklab.protocol.reproduce import protocol_from

RESULTS = ROOT / "results"


def committed_runs() -> dict[str, list[tuple[str, dict]]]:
    """``{row: [(file, stored loss config), ...]}`` of the committed single-run results (train.py's)."""
    runs: dict[str, list] = {}
    for path in sorted(RESULTS.rglob("*.json")):
        record = json.loads(path.read_text())
        if not (isinstance(record, dict) and isinstance(record.get("config"), dict) and "loss" in record["config"]):
            continue
        if "experiment" not in record:
            continue
        named = re.search(r"experiment=(\S+)", record["command"]).group(1).split(",")
        (row,) = [n for n in named if n.split("/")[-1] == record["experiment"].split("/")[-1]]
        runs.setdefault(row, []).append((str(path.relative_to(ROOT)), record["config"]["loss"]))
    return runs


def test_every_committed_run_composes_the_loss_it_ran_from_its_row(composed_rows):
    runs = committed_runs()
    assert {"fmnistlt/la_stk", "stk/multi30k/stk", "stk/multi30k/stk_paper_update"} <= set(runs)
    for row, stored in runs.items():
        composed = OmegaConf.to_container(composed_rows[row].loss, resolve=True)
        for path, loss in stored:
            assert loss == composed, f"{path}: experiment={row} now composes another loss"


def test_the_synthetic_columns_and_tabular_presets_keep_the_committed_kernel_path(composed_rows, compose_cfg):
    synthetic = json.loads((RESULTS / "synthetic" / "table2.json").read_text())["config"]
    columns = [row for name in synthetic["experiments"] for row in synthetic[name]["columns"]]
    pinned = [row for row in columns if "compile_min_n" in composed_rows[row].loss]
    assert {"stk/table2/matk", "stk/table2/stk_srelu", "stk/figure3/stk", "stk/figure4/stk"} <= set(pinned)
    for row in pinned:
        assert composed_rows[row].loss.compile_min_n == COMMITTED_COMPILE_MIN_N, row

    stored = {}
    for path in (RESULTS / "tabular").rglob("*-stk.json"):
        record = json.loads(path.read_text())
        stored[record["result"]["preset"]] = record["config"]["protocol"]
    for preset in config_groups(ROOT / "configs")["preset"]:
        protocol = protocol_from(compose_cfg("experiment=stk/table3/australian", f"preset={preset}").preset)
        assert protocol.compile_min_n == COMMITTED_COMPILE_MIN_N, preset
        if preset in stored:
            assert protocol.fingerprint("stk") == stored[preset], f"preset={preset} no longer resumes its cells"


def test_the_loss_configs_default_to_the_librarys_fast_path(compose_cfg):
    from hydra.utils import instantiate

    for loss in ("stk", "matk"):
        aggregate = instantiate(compose_cfg(f"loss={loss}").loss)
        assert aggregate.compile_min_n is None
        assert aggregate.path_for(torch.zeros(1, 16)) == "native", loss


def test_the_tabular_members_train_on_the_presets_kernel_path():
    from hydra.utils import instantiate

    from topklab.engine.aggregates import aggregate_node
    from topklab.protocol import Grid
    from topklab.protocol.cell import Protocol

    grid = Grid(k=[1], C=[1.0], lr=[0.1], delta=[0.1])
    batch = torch.zeros(1, 16)
    for name in ("stk", "matk"):
        committed = instantiate(Protocol(grid=grid).members_aggregate(aggregate_node(name)))
        assert committed.compile_min_n == COMMITTED_COMPILE_MIN_N and committed.lam_update == "gradient"
        assert committed.path_for(batch) == "eager", name
        fast = instantiate(Protocol(grid=grid, compile_min_n=None).members_aggregate(aggregate_node(name)))
        assert fast.path_for(batch) == "native", name
    assert Protocol(grid=grid).members_aggregate(aggregate_node("average")) == aggregate_node("average")
