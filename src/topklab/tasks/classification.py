"""Multi-class classification: top-1/top-5 accuracy, per-class accuracy, and the long-tailed
many / medium / few-shot groups."""

from __future__ import annotations

import torch

from topklab.tasks.base import Task
from topklab.tasks.classification_metrics import classification_metrics

SCALARS = ("top1", "top5", "many", "medium", "few", "ece")


class ClassificationTask(Task):
    """Scores logits (N, C) against labels (N,); accuracies in percent, higher is better.

    Parameters
    ----------
    shot_counts : training images per class that define the groups (given by the data: the
        long-tailed training set before the validation hold-out)
    many_shot : int, a class with more images is many-shot (default 100)
    few_shot : int, a class with fewer images is few-shot (default 20); in between is medium

    Examples
    --------
    >>> task = ClassificationTask(shot_counts=[500, 50, 5])
    >>> m = task.metrics(torch.eye(3), torch.tensor([0, 1, 0]))
    >>> round(m["top1"], 2), m["per_class"], task.higher_is_better("top5")
    (66.67, [50.0, 100.0, None], True)
    """

    primary = "top1"

    def __init__(self, shot_counts: list[int], many_shot: int = 100, few_shot: int = 20):
        if not 0 < few_shot <= many_shot:
            raise ValueError(f"task needs 0 < few_shot <= many_shot, got few_shot={few_shot}, many_shot={many_shot}")
        self.shot_counts = list(shot_counts)
        self.many_shot, self.few_shot = many_shot, few_shot

    def outputs(self, model, x, y, split: str) -> torch.Tensor:
        """Logits; a test-time ensemble batch (B, crops, C, H, W) gets the mean of its crops' logits
        (PEL/LIFT average logits, not probabilities)."""
        if x.dim() == 5:
            return model(x.flatten(0, 1)).float().view(x.shape[0], x.shape[1], -1).mean(1)
        return model(x).float()

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        result = classification_metrics(outputs, targets, self.shot_counts, many=self.many_shot, few=self.few_shot)
        result.pop("score")
        return result

    def higher_is_better(self, metric: str) -> bool:
        if metric not in SCALARS[:2]:
            raise ValueError(f"select on one of top1, top5 (got {metric!r})")
        return True

    def scalar_metrics(self, metrics: dict) -> dict:
        """The per-epoch summary columns (per-class accuracies stay in the final summary)."""
        return {k: metrics[k] for k in SCALARS if k in metrics}
