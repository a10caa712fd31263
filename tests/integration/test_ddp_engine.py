"""`torchrun --nproc_per_node 2 train.py ...` (gloo on CPU) trains the same model as one process:
the engine shards each global batch by rank, DDP averages the gradients of the model and λ, and
evaluation outputs are gathered. ATk and a solved λ need objective.gather_losses=true for the global
top-k or root."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT
from topklab.engine.run import train

TINY = ["dataset=wisconsin", "engine.epochs=2", "logger=none"]


def run(tmp_path, name, *args, ranks=1):
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        if ranks > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            *launcher,
            str(ROOT / "train.py"),
            *TINY,
            *args,
            f"hydra.run.dir={tmp_path / name}",
            f"paths.log_dir={tmp_path / 'logs'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-8000:]  # enough to show a failing rank's own lines
    return json.loads((tmp_path / name / "summary.json").read_text())


def one_process(compose_cfg, tmp_path, *args) -> dict:
    """The single-process reference, trained in this process at one thread as each rank runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(compose_cfg(*TINY, *args), tmp_path / "one")
    finally:
        torch.set_num_threads(threads)


def same_training(a: dict, b: dict) -> bool:
    return (
        a["metrics"] == b["metrics"]
        and a["best_step"] == b["best_step"]
        and a["steps"] == b["steps"]
        and (a["lambda"] is None or abs(a["lambda"] - b["lambda"]) < 1e-5)
    )


@pytest.mark.parametrize("loss", ["loss=stk", pytest.param("loss=matk", marks=pytest.mark.slow)])
def test_two_ranks_train_like_one_process_for_sums_over_samples(tmp_path, loss):
    """With a trained λ (the paper's update) MATk/STk is a sum over samples: each rank's share is exact."""
    one = run(tmp_path, "one", loss, "loss.k=0.5", "loss.lam_update=gradient")
    two = run(tmp_path, "two", loss, "loss.k=0.5", "loss.lam_update=gradient", ranks=2)
    assert same_training(one, two)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())


def test_a_solved_lambda_needs_the_gathered_losses_under_ddp(compose_cfg, tmp_path):
    """λ solved per batch is the root of the losses a rank sees: the global batch's with gather_losses."""
    one = one_process(compose_cfg, tmp_path, "loss=stk", "loss.k=0.5")
    gathered = run(tmp_path, "gathered", "loss=stk", "loss.k=0.5", "objective.gather_losses=true", ranks=2)
    assert same_training(one, gathered)


def test_atk_needs_the_gathered_losses_under_ddp(compose_cfg, tmp_path):
    one = one_process(compose_cfg, tmp_path, "loss=atk", "loss.k=0.25")
    gathered = run(tmp_path, "gathered", "loss=atk", "loss.k=0.25", "objective.gather_losses=true", ranks=2)
    local = run(tmp_path, "local", "loss=atk", "loss.k=0.25", ranks=2)
    assert same_training(one, gathered)
    assert not same_training(one, local)


CLOSE = """
import os

import torch

from topklab.engine.distributed import Distributed


def gloo_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:  # a thread that has just ended
            pass
    return [name for name in names if "gloo" in name]


ctx = Distributed.from_env(backend="gloo").init()
wrapped = ctx.wrap(torch.nn.Linear(3, 1))
wrapped(torch.randn(4, 3)).sum().backward()
ctx.barrier()
cycle = {"wrapped": wrapped}
cycle["self"] = cycle  # the wrapper left in a reference cycle, as a finished engine may leave it
del wrapped, cycle
ctx.close()
with open(os.environ["THREADS_OUT"] + os.environ["RANK"], "w") as out:
    out.write(repr(gloo_threads()))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists the threads in /proc")
def test_close_frees_the_process_group_and_ends_gloos_threads(tmp_path):
    """After close() no gloo thread is left to run into interpreter exit, where one that drops a
    tensor aborts the rank (`terminate called without an active exception`)."""
    script = tmp_path / "close.py"
    script.write_text(CLOSE)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "THREADS_OUT": str(tmp_path / "threads_rank")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-8000:]
    left = {rank: (tmp_path / f"threads_rank{rank}").read_text() for rank in (0, 1)}
    assert left == {0: "[]", 1: "[]"}, left
