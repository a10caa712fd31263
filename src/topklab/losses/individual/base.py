from __future__ import annotations

import torch


def scores_of(output: torch.Tensor) -> torch.Tensor:
    """One score per sample: outputs of shape (n,), (n, 1), or batched (P, n, 1) -> (P, n)."""
    if output.dim() >= 2 and output.shape[-1] == 1:
        return output[..., 0]
    if output.dim() != 1:
        raise ValueError(f"expected one score per sample, shape (n,) or (n, 1), got {tuple(output.shape)}")
    return output
