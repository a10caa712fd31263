"""Image classification metrics: top-1/top-5, per-class accuracy and the long-tailed groups
(many / medium / few-shot: more than 100, 20–100, fewer than 20 training images per class)."""
from __future__ import annotations

import torch


def shot_groups(class_counts: list[int], many: int = 100, few: int = 20) -> dict[str, list[int]]:
    """Class indices per group: many (count > many), medium (few <= count <= many), few (count < few).

    Examples
    --------
    >>> shot_groups([500, 100, 20, 19])
    {'many': [0], 'medium': [1, 2], 'few': [3]}
    """
    return {
        "many": [c for c, n in enumerate(class_counts) if n > many],
        "medium": [c for c, n in enumerate(class_counts) if few <= n <= many],
        "few": [c for c, n in enumerate(class_counts) if n < few],
    }


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor, class_counts: list[int],
                           topk: tuple[int, ...] = (1, 5), many: int = 100, few: int = 20) -> dict:
    """Accuracies in percent. ``per_class[c]`` is None for a class absent from ``labels``; a group
    with no classes (or no evaluated images) is None. ``score`` (higher is better) is top-1."""
    num_classes = logits.shape[1]
    labels = labels.to(logits.device)
    ranked = logits.topk(min(max(topk), num_classes), dim=1).indices
    hits = ranked == labels[:, None]
    result = {f"top{k}": float(hits[:, :k].any(1).double().mean() * 100) for k in topk if k <= num_classes}
    correct = hits[:, 0].double()
    totals = torch.bincount(labels, minlength=num_classes).double()
    right = torch.bincount(labels, weights=correct, minlength=num_classes)
    per_class = [float(r / t * 100) if t > 0 else None for r, t in zip(right.tolist(), totals.tolist())]
    for group, classes in shot_groups(class_counts, many, few).items():
        values = [per_class[c] for c in classes if per_class[c] is not None]
        result[group] = sum(values) / len(values) if values else None
    result["per_class"] = per_class
    result["score"] = result["top1"]
    return result
