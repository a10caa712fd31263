"""Tabular binary classification (test misclassification %) and regression (RMSE)."""

from __future__ import annotations

import torch

from topklab.tasks.base import Task
from topklab.tasks.metrics import TASK_METRIC


class TabularTask(Task):
    """Scores a model's outputs on a tabular split: ``error_pct`` for labels in {−1, +1},
    ``rmse`` for regression targets (both lower is better).

    Parameters
    ----------
    target : binary | regression, what the dataset's labels are (given by the data)

    Examples
    --------
    >>> task = TabularTask("binary")
    >>> task.metrics(torch.tensor([0.5, -1.0, 2.0, -0.1]), torch.tensor([1.0, 1.0, 1.0, -1.0]))
    {'error_pct': 25.0}
    >>> task.primary, task.higher_is_better("error_pct")
    ('error_pct', False)
    """

    def __init__(self, target: str):
        if target not in TASK_METRIC:
            raise ValueError(f"task target={target!r}; choose one of {', '.join(TASK_METRIC)}")
        self.target = target
        self.primary, self._metric = TASK_METRIC[target]

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        return {self.primary: float(self._metric(outputs, targets.to(outputs.device)))}

    def higher_is_better(self, metric: str) -> bool:
        if metric != self.primary:
            raise ValueError(f"metric {metric!r} is not reported for {self.target} data; use {self.primary}")
        return False

    def scalar_metrics(self, metrics: dict) -> dict:
        """The per-epoch summary columns."""
        return dict(metrics)
