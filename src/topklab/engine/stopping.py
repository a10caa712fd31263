"""Best-by-validation tracking and patience, vectorised over independent members.

One model is a population of one: the per-model engine and the population executor share this
tracker, so "what counts as an improvement" and "when to stop" are written once.
"""

from __future__ import annotations

import torch

from topklab.utils.checks import check_int

REPORT_STATES = ("best", "last")  # what a run returns: its best-validation state (roll-back) or the one it stopped in


class EarlyStopping:
    """Tracks, per member, the best validation score and the step it was reached.

    A score improves on the best when it exceeds it by more than ``min_delta`` (strictly; a tie
    keeps the earlier step) and is finite. A member should stop once ``patience`` steps have passed
    since its best step.

    Parameters
    ----------
    initial : Tensor (P,), higher-is-better validation scores before the first step (step 0)
    patience : int >= 1 or None, steps without improvement before stopping; None never stops
    min_delta : float >= 0, the smallest rise that counts as an improvement

    Examples
    --------
    >>> tracker = EarlyStopping(torch.tensor([0.5, 0.5]), patience=2, min_delta=0.0)
    >>> tracker.update(1, torch.tensor([0.6, 0.5]))
    (tensor([ True, False]), tensor([False, False]))
    >>> tracker.update(2, torch.tensor([0.6, 0.4]))
    (tensor([False, False]), tensor([False,  True]))
    >>> tracker.best_step.tolist()
    [1, 0]
    """

    def __init__(self, initial: torch.Tensor, patience: int | None = None, min_delta: float = 0.0):
        check_int("patience", patience, allow_none=True)
        if not min_delta >= 0:
            raise ValueError(f"min_delta={min_delta!r} must be >= 0")
        self.best_score = initial.detach().to(torch.float64).clone()
        self.best_step = torch.zeros(len(self.best_score), dtype=torch.long)
        self.patience = patience
        self.min_delta = float(min_delta)

    def update(
        self, step: int, score: torch.Tensor, ids: torch.Tensor | None = None, finite: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the scores of members ``ids`` (default: all) at ``step``; ``finite`` (same
        shape) marks members whose objective stayed finite. Returns the masks (aligned with
        ``score``) of members that improved and of members whose patience ran out."""
        ids = torch.arange(len(self.best_score)) if ids is None else ids
        score = score.detach().to(torch.float64)
        improved = score > self.best_score[ids] + self.min_delta
        if finite is not None:
            improved &= finite
        self.best_score[ids[improved]] = score[improved]
        self.best_step[ids[improved]] = step
        if self.patience is None:
            return improved, torch.zeros_like(improved)
        return improved, (step - self.best_step[ids]) >= self.patience

    def state_dict(self) -> dict:
        return {"best_score": self.best_score.clone(), "best_step": self.best_step.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.best_score = state["best_score"].clone()
        self.best_step = state["best_step"].clone()
