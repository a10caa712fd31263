from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CrossEntropy(nn.Module):
    """Per-sample softmax cross-entropy ``ℓ = −log softmax(f(x))_y`` over C classes. No reduction.

    Parameters
    ----------
    label_smoothing : float in [0, 1)
        As in :func:`torch.nn.functional.cross_entropy`.

    Examples
    --------
    >>> CrossEntropy()(torch.zeros(2, 4), torch.tensor([0, 3]))
    tensor([1.3863, 1.3863])
    """

    def __init__(self, label_smoothing: float = 0.0):
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 1)")
        self.label_smoothing = label_smoothing

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target.long(), reduction="none", label_smoothing=self.label_smoothing)
