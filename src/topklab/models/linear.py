from __future__ import annotations

import torch
from torch import nn


class Linear(nn.Module):
    """Linear predictor ``f(x) = wᵀx + b``.

    Parameters
    ----------
    in_features : int
        Number of input features (set from the dataset by the training code).
    out_features : int
        1 for binary/regression scores, C for C-class logits.
    """

    def __init__(self, in_features: int, out_features: int = 1):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)
