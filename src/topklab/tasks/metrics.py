"""Evaluation metrics, named once. Each reduces over the last (sample) dimension, so the same
function scores one model (n,) or a population (P, n). ``score`` is higher-is-better."""

from __future__ import annotations

import torch

from topklab.losses.individual.base import scores_of


def misclassification_pct(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Percentage of samples whose predicted sign differs from the label in {−1, +1}
    (a score of exactly 0 counts as +1)."""
    predicted = torch.where(scores_of(output) >= 0, 1.0, -1.0)
    return (predicted != target).to(torch.float64).mean(-1) * 100.0


def rmse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(((scores_of(output) - target) ** 2).mean(-1))


TASK_METRIC = {
    "binary": ("error_pct", misclassification_pct),
    "regression": ("rmse", rmse),
}


def evaluate(task: str, output: torch.Tensor, target: torch.Tensor) -> dict:
    """``{metric_name: value, "score": higher-is-better value}`` for one model."""
    name, fn = TASK_METRIC[task]
    value = float(fn(output, target))
    return {name: value, "score": -value}
