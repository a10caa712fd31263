from __future__ import annotations

import torch


def scores_of(output: torch.Tensor) -> torch.Tensor:
    """One score per sample: outputs of shape (n,), (n, 1), or batched (P, n, 1) -> (P, n)."""
    if output.dim() >= 2 and output.shape[-1] == 1:
        return output[..., 0]
    if output.dim() != 1:
        raise ValueError(f"expected one score per sample, shape (n,) or (n, 1), got {tuple(output.shape)}")
    return output


def class_count_tensor(loss: str, class_counts) -> torch.Tensor:
    """The training class sizes as float64, checked: given, and every class non-empty."""
    if class_counts is None:
        raise ValueError(f"{loss} needs class_counts (the training class sizes); use it with an image dataset")
    counts = torch.as_tensor(list(class_counts), dtype=torch.float64)
    if (counts <= 0).any():
        raise ValueError(f"{loss}: every class needs at least one training example, got counts {counts.tolist()}")
    return counts
