"""What every task shares: how the engine gets a batch's outputs to score."""

from __future__ import annotations


class Task:
    """A task scores a split from the outputs of its batches.

    :meth:`outputs` turns one evaluation batch into per-row outputs (a tensor, or a dict of
    tensors with one row per sample); the engine concatenates them over the split and hands them
    to ``metrics(outputs, data.targets(split))``. The default is the model's float logits.
    """

    primary: str

    def outputs(self, model, x, y, split: str):
        return model(x).float()
