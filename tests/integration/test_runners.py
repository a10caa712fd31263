"""One entry point for every row: ``python train.py experiment=<row>`` runs a tabular row's cells under
a preset (runner=tabular_cells), a synthetic column (runner=synthetic_column) or a whole committed
synthetic file (runner=synthetic_experiment), and every other row as
one model (runner=model); each runner refuses, before Hydra starts, a command line it cannot honour."""

import json
import os
import re
import subprocess
import sys

import pytest
from hydra import initialize_config_dir

from helpers import CONFIG_DIR, ROOT
from topklab.cli import preflight
from topklab.config import compose_run
from topklab.engine.build import build
from topklab.engine.run import ModelRun
from topklab.utils.errors import TopklabError


def train_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_tabular_row_runs_its_cells_under_its_preset(tmp_path, capsys):
    row = "stk/table3/australian"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):  # the cells are composed in the run
        committed = compose_run([f"experiment={row}", f"paths.log_dir={tmp_path}"])
        stored = {p: p.read_bytes() for p in (ROOT / "results" / "tabular" / "quick").rglob("*.json")}
        build(committed.runner, "runner")(committed, tmp_path / "a", overrides=[f"experiment={row}"], experiment=row)
        out = capsys.readouterr().out  # the committed cells, computed under other code: checked in a folder of its own
        assert f"5 of 5 cells in {ROOT}/results/tabular/quick were stored under other settings (code " in out
        assert f"training them into {tmp_path / 'a' / 'cells'} to compare" in out
        assert re.search(r"^reproduced bit for bit: [0-5] of 5", out, flags=re.M), out
        assert len(list((tmp_path / "a" / "cells").rglob("*.json"))) == 5
        assert {p: p.read_bytes() for p in (ROOT / "results" / "tabular" / "quick").rglob("*.json")} == stored
        refusing = compose_run([f"experiment={row}", "check_result=false", f"paths.log_dir={tmp_path}"])
        with pytest.raises(TopklabError, match=r"5 of 5 stored cells differ: .*other settings \(code "):
            build(refusing.runner, "runner")(
                refusing, tmp_path / "c", overrides=[f"experiment={row}", "check_result=false"], experiment=row
            )

        trial = ["preset.max_epochs=1", "preset.n_splits=2", "runner.aggregates=[stk]", "runner.progress=false"]
        cfg = compose_run([f"experiment={row}", *trial, f"paths.log_dir={tmp_path}"])
        build(cfg.runner, "runner")(cfg, tmp_path / "b", overrides=[f"experiment={row}", *trial], experiment=row)
    [cell] = (tmp_path / "b" / "cells").glob("**/*.json")  # a changed preset field: into the run's directory
    record = json.loads(cell.read_text())["result"]
    assert record["preset"] == "quick" and record["cell"]["aggregate"] == "stk"
    assert len(record["per_split"]["test"]) == 2 and record["selected"]["k"] in (1, 0.5, 0.9)


def test_a_synthetic_row_runs_its_column(tmp_path):
    settings = (
        "['k_grid=[0.5]','time_repeats=1','sizes.train=400','sizes.val=100','sizes.test=100','trainer.max_epochs=2']"
    )
    done = train_py(
        "experiment=stk/table2/stk_srelu",
        "runner.repeats=1",
        f"runner.settings={settings}",
        f"paths.log_dir={tmp_path}",
    )
    assert done.returncode == 0, done.stderr
    [path] = tmp_path.glob("train/runs/*/table2.json")
    result = json.loads(path.read_text())
    assert list(result["result"]["columns"]) == ["STk (SReLU)"] and result["config"]["repeats"] == 1
    assert result["config"]["sizes"]["train"] == 400


@pytest.mark.parametrize("row", ["stk/table3/australian", "stk/table2/atk"])
def test_a_tabular_or_synthetic_row_trains_one_model_with_runner_model(compose_cfg, tmp_path, row):
    cfg = compose_cfg(f"experiment={row}", "runner=model", "engine.epochs=1", "logger=none")
    assert build(cfg.runner, "runner") == ModelRun()
    value = ModelRun()(cfg, tmp_path / "run", overrides=[f"experiment={row}", "runner=model", "~preset"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert value == summary["metrics"]["val"]["error_pct"]


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["experiment=stk/table3/australian", "engine.epochs=3"],
            "error: engine.epochs=3 does not reach the cells: each is composed from the row and the preset; "
            "change a preset field (preset.<field>=) or the row's yaml, or train one model with runner=model",
        ),
        (
            ["runner=tabular_cells"],
            "error: runner=tabular_cells runs a row of Tables 3, 4 and 6 (experiment=stk/table3/<dataset> ...), "
            "not a run without experiment=; use runner=model for one model",
        ),
        (
            ["dataset=sinc", "preset=full"],
            "error: preset=full sets the tabular protocol of a row's cells (runner=tabular_cells); "
            "this run trains one model (runner=model): drop it",
        ),
        (
            ["experiment=fmnistlt/la_stk", "runner=synthetic_column"],
            "error: runner=synthetic_column runs a column row of table2, figure3, figure4 "
            "(experiment=stk/table2/<column> ...), not fmnistlt/la_stk",
        ),
        (
            ["experiment=stk/table3/australian", "+preset.foo=2"],
            "error: preset: Protocol.__init__() got an unexpected keyword argument 'foo'",
        ),
        (
            ["experiment=stk/table2/stk_srelu", "loss.k=3"],
            "error: loss.k=3 does not reach the column: its task, data and training are "
            "configs/reproduce_synthetic.yaml's; set one with 'runner.settings=[\"<field>=<value>\"]'",
        ),
    ],
)
def test_a_runner_refuses_what_it_cannot_honour_before_hydra_starts(capsys, tmp_path, args, line):
    with pytest.raises(SystemExit) as exit_:
        preflight([*args, f"paths.log_dir={tmp_path}"], ROOT / "configs")
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == line
    assert not any(tmp_path.iterdir())


def test_the_protocol_runners_refuse_torchrun(monkeypatch, compose_cfg):
    from topklab.protocol.reproduce import TabularCells
    from topklab.synthetic.experiment import SyntheticColumn

    monkeypatch.setenv("WORLD_SIZE", "2")
    for runner, row in ((TabularCells(), "stk/table3/australian"), (SyntheticColumn(), "stk/figure3/atk")):
        with pytest.raises(TopklabError, match=r"runs in one process; start it without torchrun$"):
            runner.check(compose_cfg(f"experiment={row}"), [f"experiment={row}"], row)


def make_reproduce_tabular_arguments(jobs: int) -> list[str]:
    """train.py's arguments in ``make reproduce-tabular JOBS=<jobs>`` (from ``make -n``)."""
    done = subprocess.run(
        ["make", "-n", "reproduce-tabular", f"JOBS={jobs}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    command = done.stdout.replace("\\\n", " ")  # the recipe's continued lines as one
    line = next(line for line in command.splitlines() if "train.py -m" in line)
    return line.split("train.py", 1)[1].split()


def test_make_reproduce_tabular_s_command_line_passes_the_checks(tmp_path):
    """The launcher, the preset and the runner's thread count are a tabular row's own settings."""
    arguments = [a for a in make_reproduce_tabular_arguments(2) if not a.startswith(("experiment=", "preset="))]
    rows = "experiment=stk/table3/australian,stk/table6/sinc"
    launcher = [f"hydra.sweep.dir={tmp_path}/sweep"]
    assert preflight([rows, "preset=full", *arguments, *launcher], ROOT / "configs") is None


@pytest.mark.integration
def test_make_reproduce_tabular_s_parallel_command_runs_its_rows(tmp_path):
    """The JOBS > 1 command on two rows, one cell each: the runner's fields reach every row of the sweep
    (a sweep composes its base config before the rows choose runner=tabular_cells)."""
    arguments = [a for a in make_reproduce_tabular_arguments(2) if not a.startswith("experiment=")]
    cells = [f"++runner.results_dir={tmp_path}/r", "++runner.aggregates=[average]", "++runner.individuals=[logistic]"]
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            *arguments,  # -m first
            "experiment=stk/table3/australian,stk/table3/wisconsin",
            *cells,
            "++runner.progress=false",
            f"hydra.sweep.dir={tmp_path}/h",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.parent.name for p in (tmp_path / "r").rglob("*.json")) == ["australian", "wisconsin"]


def test_a_synthetic_file_row_runs_every_column_and_a_trial_stays_in_its_run_directory(tmp_path):
    """stk/synthetic/table2_intended: the row's settings (the intended covariance, the file's suffix)
    reach the protocol; changing runner.settings on the command line is a trial, written beside the
    run, never into results/synthetic/."""
    small = "'k_grid=[0.5]','time_repeats=1','sizes.train=300','sizes.val=100','sizes.test=100','trainer.max_epochs=1'"
    row = "stk/synthetic/table2_intended"
    overrides = [
        f"experiment={row}",
        "runner.repeats=1",
        f"runner.settings=[{small},'task.covariance=intended','suffix=_intended']",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):  # the runner composes the protocol
        cfg = compose_run([*overrides, f"paths.log_dir={tmp_path}"])
        build(cfg.runner, "runner")(cfg, tmp_path / "run", overrides=overrides, experiment=row)
    result = json.loads((tmp_path / "run" / "table2_intended.json").read_text())
    assert len(result["result"]["columns"]) == 9 and result["config"]["task"]["covariance"] == "intended"


def test_make_reproduce_synthetic_runs_the_six_committed_files_and_passes_the_checks():
    dry = subprocess.run(["make", "-n", "reproduce-synthetic"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    [line] = [line for line in dry.stdout.splitlines() if "train.py" in line]
    argv = line.split("train.py", 1)[1].replace("'", "").split()
    preflight(argv, CONFIG_DIR)  # composes every row and runs its runner's checks; exits 2 on a bad one
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        files = set()
        for row in sorted((CONFIG_DIR / "experiment" / "stk" / "synthetic").glob("[!_]*.yaml")):
            runner = compose_run([f"experiment=stk/synthetic/{row.stem}"]).runner
            suffix = next((s.split("=", 1)[1] for s in runner.settings if s.startswith("suffix=")), "")
            files |= {f"{experiment}{suffix}.json" for experiment in runner.experiments}
    assert files == {p.name for p in (ROOT / "results" / "synthetic").glob("*.json")}
