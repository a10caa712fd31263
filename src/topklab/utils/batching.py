"""Batch counting shared by every trainer and loader."""

from __future__ import annotations


def batches_per_epoch(n_train: int, batch_size: int, drop_last: bool) -> int:
    """Mini-batches in one pass over ``n_train`` rows; a lone incomplete batch is never dropped."""
    full, rest = divmod(n_train, batch_size)
    return full + (1 if rest and not (drop_last and full) else 0)
