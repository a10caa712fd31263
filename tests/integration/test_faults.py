"""No silent wrong result: every fault around a run ends in one line that names the cause and the fix,
a non-zero exit through the command line, and nothing half-written (no partial result or record,
no temporaries). A bug is not a fault: it keeps its traceback.

Covered elsewhere, not repeated here: SIGTERM and Ctrl-C mid-epoch (a checkpoint, one line, 128 +
the signal, an exact resume) in ``test_vision_engine.py::test_a_signal_saves_a_checkpoint_and_the_rerun_resumes_exactly``;
a SIGKILL at any moment of a run (also under torchrun) in ``test_vision_engine.py::test_killed_run_resumes_to_exactly_the_uninterrupted_metrics``;
a code change before a rerun in ``test_run_identity.py::test_a_finished_run_is_not_reused_under_other_code_unless_forced``;
a non-finite loss in ``test_sweeps.py::test_a_single_failed_run_exits_2_with_one_line``.
"""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import topklab.utils.io as io
from helpers import ROOT
from helpers.vision_files import write_fashion_mnist
from helpers.vision_runs import TINY_FMNIST
from topklab.engine.checkpoint import run_key
from topklab.engine.run import train
from topklab.engine.run_identity import _code_version
from topklab.utils.errors import TopklabError, fail

# sinc regression: 500 training rows, 31 steps an epoch of batch 16, a run in a fraction of a second
SINC = ["dataset=sinc", "logger=none", "result_file=null", "engine.checkpoint=true", "engine.resume=true"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def one_line(text: str) -> str:
    """The only line of ``text`` (stderr, an error message)."""
    lines = text.strip("\n").splitlines()
    assert len(lines) == 1, text
    return lines[0]


def temporaries(root) -> list:
    return sorted(str(p) for p in root.rglob("*.tmp"))


def failure(call) -> str:
    """The one-line message of the TopklabError that ``call()`` raises."""
    with pytest.raises(TopklabError) as raised:
        call()
    return one_line(str(raised.value))


# --- the run's output folders: Hydra's run directory, checkpoints, results -------------------------


def test_a_run_directory_under_a_file_is_one_line_from_the_command_line(tmp_path):
    """Hydra would make the run directory itself and end in a traceback; train.py checks it first."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")  # refused even to root, unlike a chmod
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "dataset=sinc",
            "logger=none",
            "engine.epochs=1",
            f"paths.log_dir={tmp_path}/logs",
            f"hydra.run.dir={blocker}/run",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"error: cannot create the run directory {blocker}/run: {blocker} is a file, "
        "not a folder; choose another hydra.run.dir"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("fault", ["read-only", "full"])
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_a_read_only_or_full_output_folder_is_one_line_before_hydra_starts(
    run_cli, tmp_path, monkeypatch, fault, multirun
):
    logs = tmp_path / "logs"
    logs.mkdir()
    if fault == "read-only":
        logs.chmod(0o555)
        if os.geteuid() == 0:  # root writes through the mode bits: a read-only mount refuses root too
            real = io.tempfile.TemporaryFile

            def refuse(*args, dir=None, **kwargs):
                if str(dir).startswith(str(logs)):
                    raise OSError(errno.EROFS, "Read-only file system")
                return real(*args, dir=dir, **kwargs)

            monkeypatch.setattr(io.tempfile, "TemporaryFile", refuse)
        reason = rf"{logs} is not writable \((Permission denied|Read-only file system)\); make it writable or"
    else:
        full_device(monkeypatch, logs)
        reason = f"no space left on the device of {logs} \\(4,096 bytes free\\); free some, or"
    what, key = ("sweep", "hydra.sweep.dir") if multirun else ("run", "hydra.run.dir")
    try:
        code, _, err = run_cli(*(["-m"] if multirun else []), "dataset=sinc", "logger=none", f"paths.log_dir={logs}")
    finally:
        logs.chmod(0o755)
    assert code == 2
    assert re.fullmatch(
        f"error: cannot create the {what} directory {logs}/train/.*: {reason} choose another paths.log_dir or {key}",
        one_line(err),
    ), err
    assert list(logs.iterdir()) == []


def test_a_run_directory_that_cannot_be_written_is_one_line_from_the_library_too(compose_cfg, tmp_path):
    """train(cfg, run_dir) called directly (scripts, notebooks) checks its run directory as train.py does."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = compose_cfg(*SINC)
    assert failure(lambda: train(cfg, blocker / "run")) == (
        f"cannot write to {blocker}/run (Not a directory); make it writable or choose another hydra.run.dir"
    )
    assert not (tmp_path / "checkpoints").exists()


def full_device(monkeypatch, folder, free=4096):
    """The device of ``folder`` (and of what lies under it) has ``free`` bytes left."""
    real = shutil.disk_usage
    monkeypatch.setattr(
        io.shutil,
        "disk_usage",
        lambda path: real(path)._replace(free=free) if str(path).startswith(str(folder)) else real(path),
    )


@pytest.mark.parametrize("fault", ["a file in the way", "full"])
def test_an_unwritable_or_full_checkpoint_folder_stops_the_run_before_training(
    compose_cfg, tmp_path, monkeypatch, fault
):
    if fault == "full":
        folder = tmp_path / "checkpoints"
        full_device(monkeypatch, folder)
        expected = (
            f"no space left on the device of {folder} (4,096 bytes free); free some, or choose another "
            "paths.checkpoint_dir"
        )
    else:
        (tmp_path / "a_file").write_text("not a folder")
        folder = tmp_path / "a_file" / "checkpoints"
        expected = (
            f"cannot write to {folder} (Not a directory); make it writable or choose another paths.checkpoint_dir"
        )
    cfg = compose_cfg(*SINC, f"paths.checkpoint_dir={folder}")
    assert failure(lambda: train(cfg, tmp_path / "run")) == expected
    assert not (tmp_path / "run").exists() and not list(tmp_path.rglob("*.pt")) and temporaries(tmp_path) == []


def test_an_unwritable_result_folder_stops_the_run_before_training(compose_cfg, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = compose_cfg(*SINC, f"result_file={blocker}/r/seed0.json", f"paths.checkpoint_dir={tmp_path}/checkpoints")
    assert failure(lambda: train(cfg, tmp_path / "run")).startswith(f"cannot write to {blocker}/r (Not a directory)")
    assert not (tmp_path / "run").exists() and not list((tmp_path / "checkpoints").glob("*/last.pt"))


def test_a_disk_that_fills_during_a_run_is_one_line_and_leaves_no_partial_file(compose_cfg, tmp_path, monkeypatch):
    """The second checkpoint finds the disk full: one line, the temporary and the run's record gone,
    no result; the first checkpoint is whole, so the same command resumes once there is space."""
    real_save, saves = torch.save, []

    def save(obj, handle, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            handle.write(b"PK\x03\x04")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, handle, *args, **kwargs)

    overrides = [*SINC, "engine.epochs=2", "engine.patience=null", f"result_file={tmp_path}/result.json"]
    cfg = compose_cfg(*overrides)
    monkeypatch.setattr(torch, "save", save)
    message = failure(lambda: train(cfg, tmp_path / "run"))
    assert message.startswith(f"no space left on the device of {tmp_path}/checkpoints/{run_key(cfg)} (")
    assert message.endswith("bytes free) while writing last.pt; free some, or point paths.* elsewhere")
    assert temporaries(tmp_path) == [] and not (tmp_path / "run").exists() and not (tmp_path / "result.json").exists()
    monkeypatch.setattr(torch, "save", real_save)
    resumed = train(compose_cfg(*overrides), tmp_path / "again")
    assert [segment["from_step"] for segment in resumed["segments"]] == [0, 31]


@pytest.mark.parametrize(
    "failure_",
    [
        OSError(28, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0"),
    ],
    ids=["ENOSPC", "torch.save short write"],
)
def test_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path, failure_):
    def write(handle):
        handle.write("part")
        raise failure_

    message = failure(lambda: io._atomic(tmp_path / "last.pt", write, "w"))
    assert message.startswith(f"no space left on the device of {tmp_path} (") and "while writing last.pt" in message
    assert list(tmp_path.iterdir()) == []


def test_another_write_failure_keeps_its_own_error(tmp_path):
    def write(handle):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        io._atomic(tmp_path / "last.pt", write, "w")
    assert list(tmp_path.iterdir()) == []


# --- the data ----------------------------------------------------------------------------------------


def test_an_empty_split_is_one_line_from_the_command_line(tmp_path):
    """50 rows split 0.6 / 0.39 / 0.01 leave the test split empty: named before training, exit 2,
    the run's record removed."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "dataset=sinc",
            "logger=none",
            "engine.epochs=1",
            "dataset.source.n=50",
            "dataset.split=[0.6,0.39,0.01]",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        "error: dataset sinc: the test split is empty (train 30, val 20, test 0 examples); "
        "give it examples with dataset.split"
    )
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_an_empty_split_of_any_family_is_one_line_before_training(compose_cfg, tmp_path):
    """The check sits where the run receives its data: an image set without test images and a
    tabular split without validation rows are named alike."""
    images = write_fashion_mnist(tmp_path / "fmnist", per_class_train=50, per_class_test=0)
    cfg = compose_cfg(*TINY_FMNIST, f"dataset.root={images}", "result_file=null")
    assert failure(lambda: train(cfg, tmp_path / "vision")) == (
        "dataset fmnistlt: the test split is empty (train 159, val 50, test 0 examples); "
        f"check its data under dataset.root={images}"
    )
    cfg = compose_cfg(*SINC, "dataset.source.n=50", "dataset.split=[0.6,0.01,0.39]")
    assert failure(lambda: train(cfg, tmp_path / "tabular")) == (
        "dataset sinc: the val split is empty (train 30, val 0, test 20 examples); give it examples with dataset.split"
    )
    assert not (tmp_path / "vision").exists() and not (tmp_path / "tabular").exists()


# --- the checkpoint folder ---------------------------------------------------------------------------

SIGKILL_DRIVER = """
import io, os, signal, sys
import torch
from hydra import initialize_config_dir
from topklab.config import compose_run
from topklab.engine.run import train

config_dir, kill_at, threads, run_dir, *overrides = sys.argv[1:]
torch.set_num_threads(int(threads))
real_save, calls = torch.save, []


def save(obj, handle, *args, **kwargs):  # the kill_at-th checkpoint: half its bytes reach the file, then SIGKILL
    calls.append(1)
    if len(calls) < int(kill_at):
        return real_save(obj, handle, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer)
    handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)


torch.save = save
with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
    cfg = compose_run(overrides)
train(cfg, run_dir)
"""


def test_a_sigkill_inside_a_checkpoint_write_leaves_the_last_checkpoint_and_the_rerun_finishes_exactly(
    compose_cfg, tmp_path
):
    """The process is killed (SIGKILL, nothing runs after it) while the third checkpoint (step 30 of
    62) is half written: the step-20 checkpoint is intact beside the torn temporary; the rerun
    removes the temporary, resumes at step 20 and ends with the uninterrupted run's metrics."""
    overrides = [*SINC, "engine.epochs=2", "engine.checkpoint_every=10", "engine.patience=null"]
    reference = train(compose_cfg(*overrides, f"paths.checkpoint_dir={tmp_path}/reference"), tmp_path / "reference")
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            SIGKILL_DRIVER,
            str(ROOT / "configs"),
            "3",
            str(torch.get_num_threads()),
            str(tmp_path / "killed"),
            *overrides,
            f"paths.log_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    cfg = compose_cfg(*overrides)
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    (torn,) = workdir.glob(".last.pt.*.tmp")
    assert json.loads((workdir / "run.json").read_text())["step"] == 20
    assert not (tmp_path / "killed" / "summary.json").exists()

    _code_version.cache_clear()  # this process hashed the source once: as the driver did, now (others may edit it)
    resumed = train(cfg, tmp_path / "resumed")
    assert not torn.exists() and temporaries(tmp_path) == []
    assert [segment["from_step"] for segment in resumed["segments"]] == [0, 20]
    assert resumed["metrics"] == reference["metrics"]
    assert (resumed["steps"], resumed["best_step"], resumed["lambda"]) == (
        reference["steps"],
        reference["best_step"],
        reference["lambda"],
    )


def test_a_resume_under_another_thread_count_is_refused_unless_forced(compose_cfg, tmp_path):
    """Thread count changes a CPU run's numbers: refused in one line naming both counts and
    engine.resume=force, the checkpoint untouched; forced, both segments are recorded."""
    threads = torch.get_num_threads()
    other = 2 if threads == 1 else 1
    overrides = [*SINC, "engine.epochs=1"]
    first = train(compose_cfg(*overrides), tmp_path / "first")
    workdir = tmp_path / "checkpoints" / run_key(compose_cfg(*overrides))
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}
    torch.set_num_threads(other)
    try:
        assert failure(lambda: train(compose_cfg(*overrides), tmp_path / "refused")) == (
            f"the checkpoint in {workdir} was written with threads {threads} → {other}; start afresh "
            "(engine.resume=false, or another paths.checkpoint_dir) or resume anyway with engine.resume=force"
        )
        assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before and not (tmp_path / "refused").exists()
        forced = train(compose_cfg(*overrides, "engine.resume=force"), tmp_path / "forced")
    finally:
        torch.set_num_threads(threads)
    assert [(s["threads"], s["from_step"]) for s in forced["segments"]] == [(threads, 0), (other, first["steps"])]
    assert forced["metrics"] == first["metrics"]


@pytest.mark.parametrize("kind", ["torn", "another model", "not a checkpoint"])
def test_a_checkpoint_this_run_cannot_use_is_one_line_and_left_as_it_is(compose_cfg, tmp_path, kind):
    """A torn ``last.pt``, one that another model wrote under this run key (a layer resized, one
    added) or a file that is no training checkpoint: one line naming it and the fix; nothing is
    overwritten and the run leaves no record."""
    cfg = compose_cfg(*SINC, "engine.epochs=1")
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    if kind == "torn":
        workdir.mkdir(parents=True)
        (workdir / "last.pt").write_bytes(b"PK\x03\x04 half a zip")
    elif kind == "another model":
        train(
            compose_cfg(*SINC, "engine.epochs=1", "model.hidden=12", f"paths.checkpoint_dir={tmp_path}/other"),
            tmp_path / "other_run",
        )
        shutil.copytree(next((tmp_path / "other").iterdir()), workdir)
    else:
        workdir.mkdir(parents=True)
        torch.save({"weights": torch.zeros(3)}, workdir / "last.pt")
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}
    message = failure(lambda: train(cfg, tmp_path / "run"))
    expected = {
        "torn": f"checkpoint {workdir}/last.pt cannot be read (",
        "another model": f"checkpoint {workdir}/last.pt does not fit this run (another model wrote it: "
        "model.net.0.weight is [12, 10] there, [10, 10] here; ",
        "not a checkpoint": f"checkpoint {workdir}/last.pt does not fit this run (it is not a training checkpoint of "
        "this engine: no module, optimizer, scheduler, scaler, rng, progress); ",
    }[kind]
    assert message.startswith(expected), message
    if kind != "torn":
        assert message.endswith(
            f"delete {workdir} to start the run over, or give this run a fresh paths.checkpoint_dir"
        )
    assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before
    assert not (tmp_path / "run").exists() and temporaries(tmp_path) == []


def test_a_corrupt_run_record_in_the_checkpoint_folder_is_one_line(compose_cfg, tmp_path):
    cfg = compose_cfg(*SINC, "engine.epochs=1", "engine.resume=false")
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    workdir.mkdir(parents=True)
    (workdir / "run.json").write_text('{"epoch": 3, "ste')
    assert failure(lambda: train(cfg, tmp_path / "run")) == (
        f"{workdir}/run.json is corrupt (Unterminated string starting at: line 1 column 14 (char 13)); "
        f"delete {workdir} to start this run afresh"
    )
    assert (workdir / "run.json").read_text() == '{"epoch": 3, "ste' and not (tmp_path / "run").exists()


def test_a_run_removes_the_temporaries_a_killed_write_left(compose_cfg, tmp_path):
    cfg = compose_cfg(*SINC, "engine.epochs=1")
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    workdir.mkdir(parents=True)
    stale = [workdir / ".last.pt.k2j4.tmp", workdir / ".run.json.x9.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    train(cfg, tmp_path / "run")
    assert not any(path.exists() for path in stale) and (workdir / "last.pt").is_file()


# --- a bug is not a fault ----------------------------------------------------------------------------


def test_an_unexpected_exception_keeps_its_traceback(run_cli, train_py, monkeypatch, tmp_path):
    """Only a TopklabError becomes one line; anything else is a bug and is printed with its
    traceback (Hydra's, its own frames left out), exit code 1."""

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the engine")

    monkeypatch.setattr("topklab.engine.run.train", broken)  # what runner=model calls
    code, _, err = run_cli("dataset=sinc", "logger=none", f"paths.log_dir={tmp_path}")
    assert code == 1
    assert "Traceback (most recent call last):" in err and "in broken" in err
    assert "ZeroDivisionError: a bug in the engine" in err and "error: " not in err

    with pytest.raises(ZeroDivisionError, match="a bug in the engine"):  # the one-line exit is for faults only
        fail(ZeroDivisionError("a bug in the engine"))
