"""Resumable training state: one atomically written ``last.pt`` per run key, plus a small
``run.json`` (logger id, progress) that can be read without loading tensors.

The run key is a hash of the resolved config minus what does not change the result (paths and
the data's location, logger, progress display, the checkpoint settings themselves), so restarting the same command
finds the checkpoint even though Hydra gives the new process a new output directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_torch_save, atomic_write_json

NOT_IN_KEY = ("paths", "logger", "result", "result_file", "row", "optimized_metric", "runner", "preset")
ENGINE_NOT_IN_KEY = ("progress", "resume", "checkpoint", "checkpoint_every")
DATASET_NOT_IN_KEY = ("root", "download")  # where the files are, not what they are


def run_key(cfg: DictConfig) -> str:
    """16 hex digits identifying what a run computes."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for key in NOT_IN_KEY:
        resolved.pop(key, None)
    for key in ENGINE_NOT_IN_KEY:
        resolved.get("engine", {}).pop(key, None)
    for key in DATASET_NOT_IN_KEY:
        resolved.get("dataset", {}).pop(key, None)
    text = json.dumps(resolved, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class CheckpointStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @property
    def path(self) -> Path:
        return self.directory / "last.pt"

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete the half-written files (``.<name>.*.tmp``) that a process killed during a write
        left here; the caller is the run that owns this directory."""
        stale = sorted(self.directory.glob(".*.tmp")) if self.directory.is_dir() else []
        for path in stale:
            path.unlink(missing_ok=True)
        return stale

    def exists(self) -> bool:
        return self.path.is_file()

    def info(self) -> dict:
        meta = self.directory / "run.json"
        if not meta.is_file():
            return {}
        try:
            info = json.loads(meta.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise TopklabError(f"{meta} is corrupt ({err}); delete {self.directory} to start this run afresh") from None
        if not isinstance(info, dict):
            raise TopklabError(f"{meta} is not a run record; delete {self.directory} to start this run afresh")
        return info

    def save(self, state: dict, info: dict) -> None:
        atomic_torch_save(self.path, state)
        atomic_write_json(self.directory / "run.json", info)

    def save_weights(self, epoch: int, state: dict, keep: int) -> None:
        """The model's weights at the end of ``epoch`` (``epoch<e>.pt``), keeping the last ``keep``."""
        atomic_torch_save(self.directory / f"epoch{epoch}.pt", state)
        for old in self.weight_epochs()[:-keep]:
            (self.directory / f"epoch{old}.pt").unlink(missing_ok=True)

    def weight_epochs(self) -> list[int]:
        return sorted(int(p.stem[5:]) for p in self.directory.glob("epoch*.pt") if p.stem[5:].isdigit())

    def load_weights(self, epoch: int) -> dict:
        return torch.load(self.directory / f"epoch{epoch}.pt", map_location="cpu", weights_only=True)

    def load(self) -> dict:
        try:
            return torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as err:  # a torn or foreign file: say which and how to start over
            raise TopklabError(
                f"checkpoint {self.path} cannot be read ({type(err).__name__}: {err}); delete that folder "
                f"to start the run over, or pass engine.resume=false"
            ) from None


TRAINING_STATE = ("module", "optimizer", "scheduler", "scaler", "rng", "progress")  # what every last.pt holds


def _listed(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def state_mismatch(saved: dict, current: dict) -> str | None:
    """Why a saved state dict does not fit a model whose state dict is ``current``, in a few words
    (entries it lacks, entries it has in excess, tensors of another shape); None when it fits.

    Examples
    --------
    >>> here = {"fc.weight": torch.zeros(5, 4), "fc.bias": torch.zeros(5)}
    >>> state_mismatch({"fc.weight": torch.zeros(10, 4), "head.bias": torch.zeros(10)}, here)
    'it lacks fc.bias; it has head.bias, which this model has not; fc.weight is [10, 4] there, [5, 4] here'
    >>> state_mismatch(here, here) is None
    True
    """
    if not isinstance(saved, dict):
        return f"it holds a {type(saved).__name__}, not a state dict"
    missing = [key for key in current if key not in saved]
    unexpected = [key for key in saved if key not in current]
    reshaped = [
        f"{key} is {list(saved[key].shape)} there, {list(value.shape)} here"
        for key, value in current.items()
        if key in saved
        and hasattr(value, "shape")
        and hasattr(saved[key], "shape")
        and tuple(saved[key].shape) != tuple(value.shape)
    ]
    parts = (
        ([f"it lacks {_listed(missing)}"] if missing else [])
        + ([f"it has {_listed(unexpected)}, which this model has not"] if unexpected else [])
        + reshaped[:3]
    )
    return "; ".join(parts) or None


def not_this_run(path: Path, detail: str) -> TopklabError:
    """The one-line error for a checkpoint that another model or program wrote under this run key."""
    return TopklabError(
        f"checkpoint {path} does not fit this run ({detail}); delete {path.parent} to start the run "
        "over, or give this run a fresh paths.checkpoint_dir"
    )
