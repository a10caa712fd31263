"""Shared input check for aggregate losses."""
from __future__ import annotations

import torch


def check_losses(losses: torch.Tensor) -> torch.Tensor:
    """Return ``losses`` if it is a non-empty 1-D tensor of per-sample losses, else raise."""
    if not isinstance(losses, torch.Tensor) or losses.dim() != 1:
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(
            f"an aggregate loss takes a 1-D tensor of per-sample losses, got {shape}; "
            f"compute the individual loss with reduction='none' and flatten it"
        )
    if losses.numel() == 0:
        raise ValueError("cannot aggregate an empty batch of losses (n=0)")
    return losses
