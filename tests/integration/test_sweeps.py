"""Sweeps survive a failed job on every local launcher, and each job is pinned to one GPU."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT
from topklab.launch import gpu
from topklab.launch.failures import FAILED, SUMMARY, clear_failures, collect_failures, failure_report, write_failure
from topklab.utils.errors import NonFiniteLossError, TopklabError

# sinc regression, one epoch: lr=0.1 trains, lr=1e30 gives a NaN loss at the second step.
DIVERGING_SWEEP = ("-m", "dataset=sinc", "engine.epochs=1", "logger=none", "optim.lr=0.1,1e30")


def run_train(*args, env=None):
    env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "launcher", ["basic", "joblib", pytest.param("submitit_local", marks=pytest.mark.slow)]
)  # submitit_local: the same callback as basic and joblib, in its own job processes (8 s)
def test_a_diverging_job_is_recorded_and_the_others_finish(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    (sweep / "7_old").mkdir(parents=True)
    (sweep / "7_old" / FAILED).write_text('{"job": 7}')  # an earlier sweep's record is not counted
    result = run_train(
        *DIVERGING_SWEEP, f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}", env={"CUDA_VISIBLE_DEVICES": "3,5"}
    )  # two (pretend) GPUs: CPU torch ignores them
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = result.stderr.strip().splitlines()[-2:]
    assert report[0] == f"error: 1 job of the sweep failed, the others ran to the end; records in {sweep / SUMMARY}"
    assert report[1].startswith("  #1 optim.lr=1e+30: non-finite loss")

    assert len(list(sweep.glob("0_*/summary.json"))) == 1  # the other job ran to the end
    [failure] = [json.loads(line) for line in (sweep / SUMMARY).read_text().splitlines()]
    assert failure["job"] == 1 and failure["error"] == "NonFiniteLossError"
    assert failure["reason"].startswith("non-finite loss") and "optim.lr=1e+30" in failure["overrides"]
    assert [json.loads(p.read_text())["reason"] for p in sweep.rglob(FAILED)] == [failure["reason"]]
    assert failure["gpu"] in ("3", "5")
    job0_log = next(sweep.glob("0_*/train.log")).read_text()
    assert "job 0 pinned to GPU 3" in job0_log
    if launcher == "submitit_local":  # one process per job: the job number decides
        assert failure["gpu"] == "5"


def test_a_single_failed_run_exits_2_with_one_line(tmp_path):
    result = run_train("dataset=sinc", "engine.epochs=1", "logger=none", "optim.lr=1e30", f"paths.log_dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: non-finite loss")
    assert "Traceback" not in result.stderr and not list(tmp_path.rglob("*.json"))


def test_failure_records_are_gathered_by_job_and_reported_one_line_each(tmp_path):
    write_failure(tmp_path / "2_b", 2, ["loss=stk", "dataset=b"], TopklabError("no file\n for b"))
    write_failure(tmp_path / "0_a", 0, ["loss=stk", "dataset=a"], NonFiniteLossError("nan at step 2"), gpu="1")
    failures = collect_failures(tmp_path)
    assert [(f["job"], f["error"], f["gpu"]) for f in failures] == [
        (0, "NonFiniteLossError", "1"),
        (2, "TopklabError", None),
    ]
    assert failure_report(failures, tmp_path / SUMMARY, {"dataset"}).splitlines() == [
        f"error: 2 jobs of the sweep failed, the others ran to the end; records in {tmp_path / SUMMARY}",
        "  #0 dataset=a: nan at step 2",
        "  #2 dataset=b: no file for b",
    ]
    clear_failures(tmp_path)
    assert collect_failures(tmp_path) == []


@pytest.mark.parametrize(
    "job,visible,configured,expected",
    [
        (0, ["0", "1"], None, "0"),
        (1, ["0", "1"], None, "1"),
        (5, ["0", "1"], None, "1"),  # round robin: N jobs on G GPUs
        (4, ["2", "3", "7"], None, "3"),  # CUDA_VISIBLE_DEVICES ids, not indices
        (3, ["0", "1", "2", "3"], ["0", "2"], "2"),  # a configured list wins over the visible devices
        (0, [], ["GPU-8f2c"], "GPU-8f2c"),  # UUIDs pass through
        (3, [], None, None),  # no GPU: not pinned
    ],
)
def test_gpu_for_job(job, visible, configured, expected):
    assert gpu.gpu_for_job(job, visible, configured) == expected


@pytest.mark.parametrize("configured,match", [([], "non-empty list"), ("0,1", "non-empty list"), ([0, 0], "distinct")])
def test_bad_gpu_lists_are_one_line_errors(configured, match):
    with pytest.raises(TopklabError, match=match):
        gpu.gpu_list(configured)


@pytest.mark.parametrize("env,expected", [("1, 3", ["1", "3"]), ("", [])])
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, env, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert gpu.visible_gpus() == expected
    assert gpu.parallel_jobs() == (len(expected) or -1)
    assert gpu.parallel_jobs([4, 5, 6]) == 3


def test_pin_gpu_takes_a_free_device_and_keeps_it(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(gpu, "_SLOT", {})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a fresh job process (on a GPU machine this
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # test process may have started CUDA already)
    monkeypatch.setenv(gpu.PINNED, "")
    held = gpu._try_lock(tmp_path / "gpu-3.lock")  # another live process of the sweep holds GPU 3
    try:
        assert gpu.pin_gpu("3", ["3", "5"], tmp_path) == "5"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and gpu.pinned_gpu() == "5"
        assert gpu.pin_gpu("3", ["3", "5"], tmp_path) == "5"  # a process is pinned once
    finally:
        os.close(held)
        if gpu._SLOT.get("lock") is not None:
            os.close(gpu._SLOT["lock"])


def test_a_process_that_started_cuda_is_not_pinned(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(gpu, "_SLOT", {})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.pin_gpu("3", ["3", "5"], tmp_path) is None and os.environ["CUDA_VISIBLE_DEVICES"] == ""
