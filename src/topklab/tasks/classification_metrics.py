"""Image classification metrics: top-1/top-5, per-class accuracy, the long-tailed groups
(many / medium / few-shot: more than 100, 20–100, fewer than 20 training images per class) and the
expected calibration error."""

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


def expected_calibration_error(logits: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    """ECE in percent: Σ_b (n_b / N)·|accuracy_b − confidence_b| over ``bins`` equal-width bins of
    the top softmax probability on [0, 1] (Guo et al. 2017; PEL/LIFT's definition, empty bins
    skipped). A confidence on a bin edge falls in the lower bin; 0 goes to the first.

    Examples
    --------
    >>> logits = torch.tensor([[10.0, 0.0], [10.0, 0.0], [0.0, 0.0]])
    >>> round(expected_calibration_error(logits, torch.tensor([0, 1, 0])), 2)  # 2/3·|0.5 − 1.0| + 1/3·|1 − 0.5|
    50.0
    """
    probabilities = torch.softmax(logits.double(), dim=1)
    confidence, predicted = (values.cpu() for values in probabilities.max(1))  # CUDA's bincount adds atomically
    correct = (predicted == labels.cpu()).double()
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    count = torch.bincount(index, minlength=bins).double()
    accuracy = torch.bincount(index, weights=correct, minlength=bins)
    confident = torch.bincount(index, weights=confidence, minlength=bins)
    used = count > 0
    return float((accuracy[used] - confident[used]).abs().sum() / len(labels) * 100)


def classification_metrics(
    logits: torch.Tensor,
    labels: torch.Tensor,
    class_counts: list[int],
    topk: tuple[int, ...] = (1, 5),
    many: int = 100,
    few: int = 20,
) -> dict:
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
    result["ece"] = expected_calibration_error(logits, labels)
    result["score"] = result["top1"]
    return result
