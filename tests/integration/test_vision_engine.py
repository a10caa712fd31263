"""The image-classification engine end to end on tiny on-disk datasets: records, selection,
profiling, exact resume after a kill, the profiler config, and every vision experiment row."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT
from helpers.vision_runs import TINY_FMNIST
from topklab.config import config_groups
from topklab.data.vision.longtail import exponential_profile
from topklab.engine.run import train


def run_train(compose_cfg, tmp_path, *overrides):
    cfg = compose_cfg(*overrides, f"paths.log_dir={tmp_path}")
    return train(cfg, tmp_path / "run"), tmp_path / "run"


def test_fmnistlt_run_writes_record_profile_and_selects_best_validation(compose_cfg, tmp_path, fmnist_root):
    summary, run_dir = run_train(
        compose_cfg,
        tmp_path,
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        "engine.epochs=3",
        "loss=stk",
        f"result_file={tmp_path}/result.json",
    )
    assert summary["data"]["class_counts"] == summary["class_counts"] == exponential_profile(40, 10, 10)
    history = [row for row in (run_dir / "epochs.csv").read_text().splitlines()[1:]]
    assert len(history) == 3
    header = (run_dir / "epochs.csv").read_text().splitlines()[0].split(",")
    for column in ("val_top1", "val_few", "images_per_s", "data_wait_share", "loss_share", "peak_memory_mb", "lambda"):
        assert column in header
    val_top1 = [float(row.split(",")[header.index("val_top1")]) for row in history]
    best_epoch = max(range(3), key=lambda i: (val_top1[i], -i)) + 1
    assert summary["best_epoch"] == best_epoch
    assert summary["metrics"]["val"]["top1"] == pytest.approx(val_top1[best_epoch - 1])
    test = summary["metrics"]["test"]
    assert set(test) >= {"top1", "top5", "many", "medium", "few", "per_class"} and len(test["per_class"]) == 10
    assert 0 < summary["cost"]["images_per_s"] and 0 <= summary["cost"]["loss_share"] < 1
    indices = json.loads((run_dir / "indices.json").read_text())
    assert len(indices["longtail"]) == sum(summary["data"]["class_counts"]) and len(indices["val"]) == 50
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["family"] == "vision" and result["result"]["summary"]["metrics"]["test"]["top1"] == test["top1"]
    assert "paths" not in result["config"] and result["provenance"]["seeds"]["seed"] == 0


def test_long_tailed_draw_is_fixed_across_training_seeds(compose_cfg, tmp_path, fmnist_root):
    records = []
    for seed in (0, 1):
        _, run_dir = run_train(
            compose_cfg,
            tmp_path / str(seed),
            *TINY_FMNIST,
            f"dataset.root={fmnist_root}",
            "engine.epochs=1",
            "engine.max_steps=1",
            f"seed={seed}",
        )
        records.append(json.loads((run_dir / "indices.json").read_text()))
    assert records[0] == records[1]
    _, run_dir = run_train(
        compose_cfg,
        tmp_path / "lt1",
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        "engine.epochs=1",
        "engine.max_steps=1",
        "dataset.lt_seed=1",
    )
    assert json.loads((run_dir / "indices.json").read_text())["longtail"] != records[0]["longtail"]


def test_profile_engine_saves_a_trace(compose_cfg, tmp_path, fmnist_root):
    _, run_dir = run_train(
        compose_cfg,
        tmp_path,
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        "engine=profile",
        "engine.batch_size=16",
        "engine.progress=false",
    )
    trace = json.loads((run_dir / "profile" / "trace.json").read_text())
    assert any("conv" in event.get("name", "") for event in trace["traceEvents"])


def test_rerunning_a_finished_run_reports_it_without_training_more(compose_cfg, tmp_path, fmnist_root):
    overrides = [*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=5", "engine.max_steps=3", "loss=stk"]
    first, _ = run_train(compose_cfg, tmp_path, *overrides)
    again, run_dir = run_train(compose_cfg, tmp_path, *overrides)
    assert (first["steps"], first["epochs"]) == (again["steps"], again["epochs"]) == (3, 1)
    assert again["metrics"] == first["metrics"] and again["lambda"] == first["lambda"]
    assert len((run_dir / "epochs.csv").read_text().splitlines()) == 2


def train_command(tmp_path, fmnist_root, *extra):
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        "engine.epochs=4",
        "engine.checkpoint_every=1",
        "engine.deterministic=true",
        f"paths.log_dir={tmp_path}/logs",
        "loss=stk",
        *extra,
    ]


SPARSE_EXCHANGE = ["gradient_exchange@engine.gradient_exchange=sampled_threshold", "engine.gradient_exchange.workers=2"]


def one_thread_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, fmnist_root):
    """The run the resume tests' interrupted runs must end equal to, trained once for both: one process,
    4 epochs, checkpoints at epoch ends only and a CSV log (neither changes what is trained)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    result = root / "reference.json"
    subprocess.run(
        train_command(root, fmnist_root, f"result_file={result}", "engine.checkpoint_every=0", "logger=csv"),
        env=one_thread_env(),
        check=True,
        capture_output=True,
    )
    return json.loads(result.read_text())["result"]["summary"], root


@pytest.mark.parametrize(
    "ranks,extra",
    [(1, []), pytest.param(2, [], marks=pytest.mark.slow), pytest.param(1, SPARSE_EXCHANGE, marks=pytest.mark.slow)],
    ids=["one process", "ddp 2 ranks", "sparse gradient exchange"],
)
def test_killed_run_resumes_to_exactly_the_uninterrupted_metrics(tmp_path, fmnist_root, uninterrupted, ranks, extra):
    """SIGKILL mid-epoch, rerun the same command: the metrics of an uninterrupted run, also under
    torchrun (gloo), where rank 0 writes the checkpoint and every rank resumes from it, and with a
    sparse gradient exchange, whose residuals and samplers' streams are in the checkpoint."""
    env = one_thread_env()
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] if ranks > 1 else []
    )

    def command(name, result):
        line = train_command(tmp_path / name, fmnist_root, f"result_file={result}", *extra)
        return [*launcher, *line[1:]] if launcher else line

    if ranks == 1 and not extra:
        a = uninterrupted[0]
    else:
        reference = tmp_path / "reference.json"
        subprocess.run(command("a", reference), env=env, check=True, capture_output=True)
        a = json.loads(reference.read_text())["result"]["summary"]
    interrupted = tmp_path / "interrupted.json"
    process = subprocess.Popen(
        command("b", interrupted), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        found = list((tmp_path / "b" / "logs" / "checkpoints").glob("*/run.json"))
        if found and json.loads(found[0].read_text())["step"] >= 15:  # mid-way through epoch 2 (10 steps per epoch)
            os.killpg(process.pid, signal.SIGKILL)  # torchrun and its ranks
            break
        time.sleep(0.005)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not interrupted.exists()
    resumed = subprocess.run(command("b", interrupted), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    b = json.loads(interrupted.read_text())["result"]["summary"]
    assert b["metrics"] == a["metrics"]
    assert (b["best_epoch"], b["steps"], b["lambda"]) == (a["best_epoch"], a["steps"], a["lambda"])


@pytest.mark.parametrize(
    "number", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["SIGTERM", "Ctrl-C"]
)
def test_a_signal_saves_a_checkpoint_and_the_rerun_resumes_exactly(tmp_path, fmnist_root, uninterrupted, number):
    """SIGTERM (a scheduler's notice) or Ctrl-C mid-epoch: the step ends, the checkpoint is written, the
    process stops with one line and 128 + the signal's number; the same command then finishes with
    the metrics of an uninterrupted run."""
    env = one_thread_env()
    interrupted = tmp_path / "interrupted.json"
    command = train_command(
        tmp_path / "b", fmnist_root, f"result_file={interrupted}", "engine.checkpoint_every=0", "logger=csv"
    )
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if list((tmp_path / "b" / "logs" / "checkpoints").glob("*/run.json")):  # epoch 1 done: training, handlers set
            os.killpg(process.pid, number)
            break
        time.sleep(0.005)
    _, stderr = process.communicate()
    assert process.returncode == 128 + number, stderr
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"error: {signal.Signals(number).name} at epoch [234], step \d+: checkpoint saved in .*; "
        r"rerun the same command to resume",
        last,
    ), last
    assert not interrupted.exists()
    stopped_at = json.loads(next((tmp_path / "b" / "logs" / "checkpoints").glob("*/run.json")).read_text())["step"]
    assert 10 <= stopped_at < 40  # after epoch 1's checkpoint, before the run's end (10 steps per epoch)
    resumed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, reference_root = uninterrupted
    b = json.loads(interrupted.read_text())["result"]["summary"]
    assert b["metrics"] == a["metrics"] and (b["best_epoch"], b["steps"]) == (a["best_epoch"], a["steps"])
    assert [segment["from_step"] for segment in b["segments"]] == [0, stopped_at]

    def logged(root):  # the resumed run's log.csv is rebuilt from the checkpoint: the uninterrupted run's rows
        (path,) = (root / "logs").rglob("log.csv")
        rows = list(csv.DictReader(path.open()))
        return [
            {k: v for k, v in row.items() if k in ("epoch", "step", "train_loss", "lambda") or k.startswith("val_")}
            for row in rows
        ]

    assert logged(tmp_path / "b") == logged(reference_root) and len(logged(reference_root)) == 4


def experiment_rows():
    return [
        row
        for row in config_groups(ROOT / "configs")["experiment"]
        if not row.startswith(
            (
                "stk/table",
                "stk/figure",
                "stk/synthetic/",
                "stk/multi30k",
                "stk/iwslt14",
                "stk/wmt17",
                "routing/",
                "petersen/imagenet1k/",
                "petersen/imagenet21kp/",
                "petersen/table5/",
            )
        )
    ]  # test_embedding_rows


def test_every_table_row_has_an_experiment():
    rows = experiment_rows()
    assert len([r for r in rows if r.startswith("petersen/cifar100/")]) == 10
    assert {r for r in rows if r.startswith("fmnistlt/")} == {
        f"fmnistlt/{r}" for r in ("ce", "la", "la_atk", "la_stk", "topk_ce")
    }
    assert {r for r in rows if r.startswith("stk/cifar100lt/")} >= {
        f"stk/cifar100lt/{r}" for r in ("la_average", "la_atk", "la_stk")
    }


# the Petersen rows differ only in the individual loss (each tested on its own): two of them run by default
PETERSEN_DEFAULT_RUNS = ("petersen/cifar100/softmax_ce", "petersen/cifar100/diffsortnets_uniform")


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(row, marks=pytest.mark.slow)
        if (row.startswith("petersen/") and row not in PETERSEN_DEFAULT_RUNS)
        or (row.startswith("sinkhorn_beta/") and row != "sinkhorn_beta/beta_100")
        else row
        for row in experiment_rows()
    ],
)
def test_experiment_row_composes_and_smoke_runs(compose_cfg, tmp_path, row, fmnist_root, cifar_root):
    data = (
        [f"dataset.root={fmnist_root}", "dataset.n_max=40", "dataset.imbalance_ratio=10", "dataset.val_per_class=5"]
        if row.startswith(("fmnistlt", "sparsification", "sinkhorn_beta"))
        else [f"dataset.root={cifar_root}", "dataset.val_fraction=0.34"]
    )
    if row.startswith("stk/cifar100lt"):
        data += ["dataset.n_max=3", "dataset.imbalance_ratio=1.5", "dataset.val_per_class=1"]
    cfg = compose_cfg(
        f"experiment={row}",
        *data,
        "engine.epochs=1",
        "engine.max_steps=1",
        "engine.batch_size=8",
        "engine.progress=false",
        f"result_file={tmp_path}/result.json",
        f"paths.log_dir={tmp_path}",
    )
    assert cfg.recipe == "multiclass" and cfg.task._target_.endswith("ClassificationTask")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 1 and (tmp_path / "result.json").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["individual=topk_ce", "individual.p_k=[0.5,0.4]"], "sums to 0.9"),
        (["individual=topk_ce", "operator@individual.operator=quicksort"], "operator"),
        (["individual=topk_ce", "individual.operator.network=quicksort"], "choose one of"),
        (["model=mlp"], "does not fit this dataset"),
        (["dataset.imbalance_ratio=1000"], "without images"),
        (["loss=atk", "loss.k=16"], "smallest batch=15"),
    ],
)
def test_bad_vision_input_is_one_line_exit_2_and_leaves_nothing(run_cli, tmp_path, fmnist_root, overrides, message):
    """train.py's command line in this process (``run_cli``; ``test_train.py`` runs it as a process)."""
    result_file = tmp_path / "result.json"
    code, _, err = run_cli(
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        f"paths.log_dir={tmp_path}/logs",
        f"result_file={result_file}",
        *overrides,
    )
    assert code == 2
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0], err
    assert not result_file.exists()
    assert not [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]


def test_missing_cifar_says_where_to_put_it(run_cli, tmp_path):
    code, _, err = run_cli(
        "dataset=cifar100", f"dataset.root={tmp_path}/nowhere", f"paths.log_dir={tmp_path}/logs", "logger=none"
    )
    assert code == 2
    assert "cifar-100-python.tar.gz" in err and "dataset.download=true" in err
    assert not list((tmp_path / "logs").glob("*/runs/*/summary.json"))


@pytest.mark.parametrize("amp", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
def test_autocast_runs_and_keeps_the_loss_in_float32(compose_cfg, tmp_path, fmnist_root, amp):
    summary, run_dir = run_train(
        compose_cfg,
        tmp_path,
        *TINY_FMNIST,
        f"dataset.root={fmnist_root}",
        "engine.epochs=1",
        "engine.max_steps=2",
        f"engine.amp={amp}",
        "loss=stk",
    )
    assert summary["amp"] == amp and summary["steps"] == 2
    header, row = (run_dir / "epochs.csv").read_text().splitlines()[:2]
    assert float(row.split(",")[header.split(",").index("train_loss")]) > 0


def test_the_cifar100lt_rows_decay_as_ldam_drw(compose_cfg):
    from topklab.engine.schedules import LRFactor

    schedule = dict(compose_cfg("experiment=stk/cifar100lt/la_stk").engine.schedule)
    factor = LRFactor(steps_per_epoch=10, epochs=200, **schedule)
    assert [factor(e * 10) for e in (100, 161, 181)] == [
        1.0,
        pytest.approx(0.01),
        pytest.approx(1e-4),
    ]  # LDAM-DRW's code


def test_deterministic_algorithms_hold_within_the_run_and_are_restored_after():
    from topklab.utils.seed import deterministic_algorithms

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"]
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    with deterministic_algorithms(False):
        assert torch.are_deterministic_algorithms_enabled() == before[0]
