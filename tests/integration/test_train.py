import json
import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, TABULAR_DATASETS
from topklab.cli import preflight
from topklab.engine import Objective, TrainingModule
from topklab.engine.run import optimized_value, train
from topklab.losses import Logistic, STk
from topklab.models import MLP
from topklab.utils.errors import NonFiniteLossError, TopklabError

FAST = ("engine.epochs=1", "logger=none")


def test_lambda_is_in_the_optimizer_and_trained(compose_cfg, tmp_path):
    model, loss = MLP(4), STk(0.5, lam_update="gradient", lam_init=0.0)
    groups = TrainingModule(model, Objective(Logistic(), loss)).parameter_groups()
    assert [g.get("weight_decay") for g in groups] == [None, 0.0]
    assert [p for p in groups[1]["params"]] == [loss.lam] and len(groups[0]["params"]) == len(list(model.parameters()))
    summary = train(compose_cfg("loss=stk", "engine.epochs=3", "logger=none"), tmp_path / "run")
    assert summary["lambda"] != 0.0


@pytest.mark.parametrize("name", TABULAR_DATASETS)
def test_one_epoch_smoke_run_per_dataset(compose_cfg, tmp_path, name):
    summary = train(compose_cfg(f"dataset={name}", *FAST), tmp_path / name)
    metric = "error_pct" if summary["task"] == "binary" else "rmse"
    assert math.isfinite(summary["metrics"]["test"][metric])
    assert (tmp_path / name / "summary.json").exists()


@pytest.mark.parametrize("loss", ["average", "maximum", "atk", "matk", "stk"])
def test_every_aggregate_trains(compose_cfg, tmp_path, loss):
    summary = train(compose_cfg(f"loss={loss}", "dataset=wisconsin", "engine.epochs=2", "logger=none"), tmp_path / loss)
    assert summary["metrics"]["test"]["error_pct"] < 50.0
    assert (summary["lambda"] is None) == (loss in ("average", "maximum", "atk"))


def test_same_seed_gives_identical_metrics(compose_cfg, tmp_path):
    cfg = compose_cfg("dataset=german", "engine.epochs=3", "logger=none", "seed=3")
    a = train(cfg, tmp_path / "a")
    b = train(cfg, tmp_path / "b")
    assert a["metrics"] == b["metrics"] and a["lambda"] == b["lambda"] and a["best_step"] == b["best_step"]
    c = train(compose_cfg("dataset=german", "engine.epochs=3", "logger=none", "seed=4"), tmp_path / "c")
    assert c["metrics"] != a["metrics"]


def test_run_record_contents(compose_cfg, tmp_path):
    run = tmp_path / "run"
    train(compose_cfg("dataset=sinc", "engine.epochs=2", "logger=csv"), run)
    assert {"config.yaml", "provenance.json", "epochs.csv", "summary.json", "log.csv"} <= {
        p.name for p in run.iterdir()
    }
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["seeds"] == {"seed": 0, "split_seed": 0, "data_generation_seed": 0}
    assert provenance["packages"]["torch"].startswith(torch.__version__.split("+")[0])
    assert provenance["hardware"]["cpu_count"] >= 1 and "sha" in provenance["git"] and "dirty" in provenance["git"]
    # the instruction set torch's kernels use (single runs differ between AVX2 and AVX-512 machines)
    assert provenance["hardware"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "cpu_model" in provenance["hardware"] and "aten_cpu_capability_env" in provenance["hardware"]
    epochs = (run / "epochs.csv").read_text().splitlines()
    assert epochs[0].startswith("epoch,step,lr,train_loss,val_rmse,lambda,best_step") and len(epochs) >= 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dataset"] == "sinc" and "rmse" in summary["metrics"]["test"]
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_non_finite_loss_stops_and_keeps_last_good_state(compose_cfg, tmp_path):
    run = tmp_path / "run"
    cfg = compose_cfg("dataset=housing", "optim=sgd", "optim.lr=1e30", "logger=none")
    with pytest.raises(NonFiniteLossError, match="non-finite loss .* lower optim.lr"):
        train(cfg, run)
    assert sorted(p.name for p in run.iterdir()) == ["last_good.pt"]
    state = torch.load(run / "last_good.pt")
    assert all(torch.isfinite(t).all() for t in state.values())


def test_without_a_per_step_check_last_good_is_the_last_finite_state(compose_cfg, tmp_path):
    """engine.finite_check=epoch (what a GPU or DDP run does): the divergence is caught at the epoch's end,
    after non-finite updates; last_good.pt is the last state known finite (here the initial model)."""
    from topklab.engine.objective import TrainingModule
    from topklab.engine.run import build_run

    overrides = ("dataset=housing", "optim=sgd", "optim.lr=1e30", "logger=none", "engine.finite_check=epoch")
    with pytest.raises(NonFiniteLossError, match="non-finite loss in epoch 1"):
        train(compose_cfg(*overrides), tmp_path / "run")
    kept = torch.load(tmp_path / "run" / "last_good.pt")
    data, model, objective, _, _ = build_run(compose_cfg(*overrides))
    initial = TrainingModule(model, objective).state_dict()
    assert kept.keys() == initial.keys() and all(torch.equal(kept[k], initial[k]) for k in kept)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["loss.k=40"], "loss.k: k=40 exceeds the number of losses n=16"),
        (["engine.batch_size=0"], "engine.batch_size=0 must be an int >= 1"),
        (["dataset.source.package=not_installed_pkg", "dataset=german"], "not installed; run `make setup`"),
        (["optim.lr=-1"], r"optim.lr=-1 must be a finite number > 0"),
        (["optim.lr=nan"], r"optim.lr=nan must be a finite number > 0"),
        (["optim.weight_decay=-0.1", "optim=sgd_momentum"], r"optim.weight_decay=-0.1 must be a finite number >= 0"),
        (["seed=1.5"], r"seed=1.5 must be an int >= 0"),
    ],
)
def test_bad_input_leaves_no_run_record(compose_cfg, tmp_path, overrides, match):
    run = tmp_path / "run"
    with pytest.raises(TopklabError, match=match):
        train(compose_cfg(*reversed(overrides)), run)
    assert not run.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["loss=foo"], "error: unknown loss 'foo'; choose one of: atk, average, matk, maximum, stk"),
        (["-m", "dataset=german,nope"], "error: unknown dataset 'nope'; choose one of: abalone,"),
        (["loss.k=0"], "error: loss: k=0 must be a positive count"),
        (["loss.k=1.5"], "error: loss: k=1.5 as a float is a fraction"),
        (["loss.delta=0"], "error: loss: delta=0 must be a positive number"),
        (["loss.delta=-0.1"], "error: loss: delta=-0.1 must be a positive number"),
        (
            ["loss.delta=1e300"],
            "error: loss: delta=1e+300 is too large: SReLU is computed without overflow for δ up to 1e+12",
        ),
        (
            ["loss.delta=1e-20"],
            "error: loss: delta=1e-20 is too small: SReLU's slope is computed without underflow for δ from 1e-15",
        ),
        (["-m", "loss.k=0.5,abc"], "error: loss: k must be an int (a count) or a float in (0, 1]"),
        (["loss=atk", "loss.k=[1,2]"], "error: loss: k must be an int"),
        (["loss.nonexistent=1"], "error: "),
    ],
)
def test_preflight_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        preflight(argv, ROOT / "configs")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_preflight_accepts_valid_sweeps(capsys):
    preflight(["-m", "loss=atk,stk", "loss.k=0.5,1", "dataset=german,housing"], ROOT / "configs")
    assert capsys.readouterr().err == ""


def train_process(*args, cwd=ROOT):
    """``python train.py ARGS`` as its own process (``run_cli``, the fixture, runs the command line in this one)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_bad_option_exits_nonzero_with_one_line_and_no_outputs(tmp_path):
    result = train_process("loss=nope", f"paths.log_dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown loss 'nope'; choose one of: atk, average, matk, maximum, stk"
    ]
    assert not any(tmp_path.iterdir())


def test_cli_missing_data_exits_nonzero_and_removes_record(run_cli, tmp_path):
    code, _, err = run_cli(
        "dataset=spambase",
        "dataset.source.variant=uci4601",
        f"dataset.source.rda_path={tmp_path}/none.rda",
        f"paths.log_dir={tmp_path}/logs",
    )
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: spambase 4601 needs")
    assert not list((tmp_path / "logs").rglob("*.json"))


def test_multirun_2x2(tmp_path):
    result = train_process(
        "-m",
        "loss=average,stk",
        "dataset=appendicitis,wisconsin",
        "engine.epochs=1",
        "logger=csv",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    summaries = sorted(tmp_path.rglob("summary.json"))
    assert len(summaries) == 4
    combos = {
        (json.loads(p.read_text())["dataset"], json.loads(p.read_text())["loss"].rsplit(".", 1)[1]) for p in summaries
    }
    assert combos == {(d, a) for d in ("appendicitis", "wisconsin") for a in ("Average", "STk")}


def test_train_returns_the_optimized_metric_for_sweepers(compose_cfg, tmp_path):
    cfg = compose_cfg("dataset=sinc", "engine.epochs=1", "logger=none")
    summary = train(cfg, tmp_path / "run")
    assert optimized_value(cfg, summary) == summary["metrics"]["val"]["rmse"]
    cfg.optimized_metric = "top1"
    with pytest.raises(
        TopklabError, match="optimized_metric='top1' is not a validation metric of this run; choose one of: rmse"
    ):
        optimized_value(cfg, summary)


def test_the_dataset_chooses_the_recipe_inside_hydras_composition(run_cli, tmp_path):
    code, out, err = run_cli("dataset=cifar100lt", "optim.momentum=0.8", "--cfg", "job")
    assert code == 0, err
    assert "recipe: multiclass" in out and "momentum: 0.8" in out
    code, out, _ = run_cli("dataset=cifar100lt", "recipe=binary", "--cfg", "job")
    assert code == 0 and "recipe: binary" in out and "topklab.models.MLP" in out
    code, _, err = run_cli("dataset=cifar100lt", "recipe=auto", f"paths.log_dir={tmp_path}")
    assert code == 2 and not any(tmp_path.iterdir())
    assert err.strip().splitlines()[0].startswith("error: dataset topklab.data.vision.CIFAR100 chooses no recipe")


def test_a_sweep_over_datasets_gives_each_job_its_datasets_recipe(tmp_path):
    result = train_process(
        "-m",
        "dataset=australian,sinc",
        "engine.epochs=1",
        "logger=none",
        "result_file=null",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    from omegaconf import OmegaConf

    jobs = [OmegaConf.load(p) for p in tmp_path.glob("*/.hydra/config.yaml")]
    assert sorted((job.dataset.name, job.recipe, job.individual._target_) for job in jobs) == [
        ("australian", "binary", "topklab.losses.Logistic"),
        ("sinc", "regression", "topklab.losses.Square"),
    ]


def test_cpu_capability_pins_torchs_kernels_from_the_command_line(tmp_path):
    """Runs on another CPU differ by points through the kernels torch picks: cpu_capability=avx2 (or
    default) makes the run use those kernels, and its provenance says so; a value set where it cannot
    act (a config file, after torch loaded) or unknown is one line."""
    import subprocess
    import sys

    from topklab.utils.provenance import check_cpu_capability

    common = [
        sys.executable,
        str(ROOT / "train.py"),
        "dataset=sinc",
        "engine.epochs=1",
        "logger=none",
        f"hydra.run.dir={tmp_path}/run",
    ]
    done = subprocess.run(
        [*common, "cpu_capability=default"],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"},
    )
    assert done.returncode == 0, done.stderr[-1500:]
    hardware = json.loads((tmp_path / "run" / "provenance.json").read_text())["hardware"]
    assert (hardware["torch_cpu_capability"], hardware["aten_cpu_capability_env"]) == ("DEFAULT", "default")
    with pytest.raises(TopklabError, match="cpu_capability='avx3'; choose one of default, avx2, avx512"):
        check_cpu_capability("avx3")
    other = "default" if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else "avx2"
    with pytest.raises(TopklabError, match=f"cpu_capability={other} but torch runs .* on the command line"):
        check_cpu_capability(other)


def test_the_dirty_flag_counts_code_not_results_written_by_earlier_jobs(tmp_path):
    import subprocess

    from topklab.utils.provenance import _git_info

    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True, capture_output=True
        )

    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "r.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    (tmp_path / "results" / "r.json").write_text('{"a": 1}\n')  # a result rewritten by an earlier job
    assert _git_info.__wrapped__(str(tmp_path))["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert _git_info.__wrapped__(str(tmp_path))["dirty"] is True
