"""How many times ``python train.py ...`` composes its config, and who composes it.

A run composes once in topklab's checks before Hydra starts (:func:`topklab.cli.preflight`: one
composition per sweep point, with the recipe the dataset's yaml chooses inside it) and in Hydra
itself (``hydra.main`` composes once to read the run mode and once to run; the basic sweeper
composes each job's config twice more, once to check the batch and once to launch it). Nothing
composes to find the recipe and nothing rewrites the command line with it. These tests pin the
counts, so that a change that adds a composition fails and one that removes some lowers them here."""

import os
import subprocess
import sys

from helpers import ROOT

# train.py, with every composition (hydra.compose and hydra.main's alike go through the config
# loader) counted by whether topklab's checks (topklab/config.py) or Hydra's run asked for it.
COUNTING_TRAIN = """
import atexit, os, runpy, sys, traceback
from hydra._internal.config_loader_impl import ConfigLoaderImpl
load, counts = ConfigLoaderImpl.load_configuration, {"topklab": 0, "hydra": 0}
def counted(self, *args, **kwargs):
    mine = any(os.path.join("topklab", "config.py") in f.filename for f in traceback.extract_stack())
    counts["topklab" if mine else "hydra"] += 1
    return load(self, *args, **kwargs)
ConfigLoaderImpl.load_configuration = counted
atexit.register(lambda: print(f"compositions: {counts}", file=sys.stderr))
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def compositions(*args) -> dict:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", COUNTING_TRAIN, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("compositions: "))
    return eval(line.partition(": ")[2])


def test_a_run_composes_once_in_the_checks_and_twice_in_hydra(tmp_path):
    assert compositions("dataset=sinc", "engine.epochs=1", "logger=none", f"paths.log_dir={tmp_path}") == {
        "topklab": 1,
        "hydra": 2,
    }


def test_a_sweep_composes_once_per_point_and_twice_per_job_in_hydra(tmp_path):
    assert compositions(
        "-m", "dataset=sinc", "engine.epochs=1", "logger=none", "optim.lr=0.1,0.2", f"hydra.sweep.dir={tmp_path}"
    ) == {"topklab": 2, "hydra": 6}
