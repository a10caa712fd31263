from __future__ import annotations

import os
from pathlib import Path


def _wandb_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbLogger:
    """Weights & Biases sink. Runs **offline** unless the user configured wandb (``WANDB_MODE``
    set, an API key in the environment or ``~/.netrc``), or ``mode`` is given explicitly.
    Every job calls ``wandb.finish()`` in ``close()``, so Hydra multiruns get one wandb run each.

    Parameters
    ----------
    project : str
        wandb project name.
    mode : {"online", "offline", "disabled"} or None
        None = decide as above.
    """

    def __init__(self, project: str = "topklab", mode: str | None = None, group: str | None = None, tags=()):
        self.project = project
        self.mode = mode
        self.group = group
        self.tags = list(tags)
        self.id: str | None = None
        self._run = None

    def resolved_mode(self) -> str:
        if self.mode:
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return os.environ["WANDB_MODE"]
        return "online" if _wandb_configured() else "offline"

    def start(self, run_dir, config: dict, resume_id: str | None = None) -> None:
        import wandb

        self._run = wandb.init(
            project=self.project,
            dir=str(run_dir),
            config=config,
            mode=self.resolved_mode(),
            group=self.group,
            tags=self.tags,
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="finish_previous",
        )
        self.id = self._run.id

    def log(self, row: dict) -> None:
        self._run.log(row)

    def replay(self, rows: list[dict]) -> None:
        """A resumed wandb run keeps its own history (``resume="allow"``): nothing to rebuild."""

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
