"""The run record: what a run leaves in its directory, written atomically.

``config.yaml`` (resolved), ``provenance.json`` (seeds, git SHA and dirty flag, packages,
hardware), ``indices.json`` (a data subset's indices, when any), ``epochs.csv`` (one row per epoch), ``summary.json`` (final metrics; written last, so
its presence marks a finished run). On a bad-input failure :meth:`discard` removes the record.
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from topklab.utils import provenance
from topklab.utils.io import atomic_torch_save, atomic_write_json, atomic_write_text


class RunRecord:
    def __init__(self, run_dir: str | Path, job_name: str | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.job_name = job_name
        self.epoch_rows: list[dict] = []

    def write_start(self, cfg: DictConfig, seeds: dict, project_root: str | Path) -> None:
        atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        self._provenance = {"seeds": seeds, **provenance.collect(project_root)}
        atomic_write_json(self.run_dir / "provenance.json", self._provenance)

    def provenance(self) -> dict:
        return self._provenance

    def write_indices(self, indices: dict) -> None:
        """The data subset's source indices (long-tailed draw, validation split), when there are any."""
        if indices:
            atomic_write_json(self.run_dir / "indices.json", indices)

    def add_epoch(self, row: dict) -> None:
        self.epoch_rows.append(row)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.epoch_rows[0]))
        writer.writeheader()
        writer.writerows(self.epoch_rows)
        atomic_write_text(self.run_dir / "epochs.csv", buffer.getvalue())

    def write_summary(self, summary: dict) -> Path:
        return atomic_write_json(self.run_dir / "summary.json", summary)

    def save_state(self, name: str, state: dict) -> Path:
        return atomic_torch_save(self.run_dir / name, state)

    def discard(self, keep: tuple[str, ...] = ()) -> None:
        """Remove everything this run (and Hydra, for it) wrote, except ``keep``; drop the
        directory if it ends up empty. Files that are not the run's own are left alone."""
        own = {
            "config.yaml",
            "provenance.json",
            "indices.json",
            "epochs.csv",
            "summary.json",
            "log.csv",
            "wandb",
            ".hydra",
            "profile",
        }
        if self.job_name:
            own.add(f"{self.job_name}.log")
        for name in own - set(keep):
            path = self.run_dir / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
        if self.run_dir.exists() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()


class SilentRecord(RunRecord):
    """What a non-main DDP rank keeps: nothing. The main rank writes the run's one record."""

    def __init__(self, run_dir: str | Path, job_name: str | None = None):
        self.run_dir = Path(run_dir)
        self.job_name = job_name
        self.epoch_rows = []

    def write_start(self, cfg: DictConfig, seeds: dict, project_root: str | Path) -> None:
        self._provenance = {"seeds": seeds}

    def write_indices(self, indices: dict) -> None:
        pass

    def add_epoch(self, row: dict) -> None:
        pass

    def write_summary(self, summary: dict) -> None:
        pass

    def save_state(self, name: str, state: dict) -> None:
        pass

    def discard(self, keep: tuple[str, ...] = ()) -> None:
        pass
