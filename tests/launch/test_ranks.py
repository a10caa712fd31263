"""Under torchrun the ranks other than 0 keep out of outputs/ and the console: Hydra's config, as
train.py composes it, gives them a temporary run folder, no saved config, no log file and warnings
only (configs/hydra/default.yaml through topklab.launch.ranks)."""

import os
import tempfile

import pytest
from hydra import initialize_config_dir

import topklab.launch  # noqa: F401  (the resolvers)
from helpers import CONFIG_DIR
from topklab.config import compose_run


def hydra_node(monkeypatch, rank) -> dict:
    """What a job of this rank reads from Hydra's node: its run folder, saved-config folder, log
    file and log level."""
    monkeypatch.setenv("RANK", str(rank))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):  # train.py's
        node = compose_run([], return_hydra_config=True).hydra
        node.runtime.output_dir = "outputs/train/runs/now"  # Hydra sets it when the job starts
        logging = node.job_logging
        return {
            "run_dir": node.run.dir,
            "output_subdir": node.output_subdir,
            "log_file": logging.handlers.file.filename,
            "level": logging.root.level,
        }


@pytest.mark.parametrize("rank", [1, 3])
def test_other_ranks_get_a_temporary_folder_no_saved_config_no_log_file_and_warnings_only(monkeypatch, rank):
    node = hydra_node(monkeypatch, rank)
    assert node == {
        "run_dir": f"{tempfile.gettempdir()}/topklab-rank{rank}",
        "output_subdir": None,
        "log_file": os.devnull,
        "level": "WARNING",
    }


def test_rank_0_and_a_run_without_torchrun_write_the_run_record(monkeypatch):
    node = hydra_node(monkeypatch, 0)
    assert "/train/runs/" in node.pop("run_dir")
    assert node == {"output_subdir": ".hydra", "log_file": "outputs/train/runs/now/train.log", "level": "INFO"}
