"""Evaluation metrics, named once. ``score`` is "higher is better" for model selection."""
from __future__ import annotations

import torch

from topklab.losses.individual.base import scores_of


def misclassification_pct(output: torch.Tensor, target: torch.Tensor) -> float:
    """Percentage of samples whose predicted sign differs from the label in {−1, +1}
    (a score of exactly 0 counts as +1)."""
    predicted = torch.where(scores_of(output) >= 0, 1.0, -1.0)
    return float((predicted != target).float().mean() * 100.0)


def rmse(output: torch.Tensor, target: torch.Tensor) -> float:
    return float(torch.sqrt(((scores_of(output) - target) ** 2).mean()))


TASK_METRIC = {
    "binary": ("error_pct", misclassification_pct),
    "regression": ("rmse", rmse),
}


def evaluate(task: str, output: torch.Tensor, target: torch.Tensor) -> dict:
    """``{metric_name: value, "score": higher-is-better value}`` for the task."""
    name, fn = TASK_METRIC[task]
    value = fn(output, target)
    return {name: value, "score": -value}
