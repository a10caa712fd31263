from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """The STk paper's 2-layer MLP (§5.1): Linear(d, hidden) → ReLU → Linear(hidden, out).

    Parameters
    ----------
    in_features : int
        Number of input features (set from the dataset by the training code).
    hidden : int
        Hidden units; the paper uses 10.
    out_features : int
        1 for binary/regression scores, C for C-class logits.
    """

    def __init__(self, in_features: int, hidden: int = 10, out_features: int = 1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
