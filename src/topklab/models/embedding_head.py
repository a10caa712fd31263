"""A classifier on precomputed embeddings (Petersen et al.'s ImageNet fine-tuning, difftopk's
``train_imagenet.py``): one linear layer by default, or hidden layers with ReLU between them."""

from __future__ import annotations

import torch
from torch import nn


class EmbeddingHead(nn.Module):
    """``Linear(in_features → num_classes)``, or ``Linear → ReLU → … → Linear`` through ``hidden_dims``.

    Parameters
    ----------
    in_features : int, embedding size (given by the data: 2048 for ResNeXt-101, 5504 for EfficientNet-L2)
    num_classes : int, classes (given by the data)
    hidden_dims : list of int >= 1, widths of hidden layers (difftopk's ``--hidden_dims``; empty: linear)

    Examples
    --------
    >>> head = EmbeddingHead(in_features=8, num_classes=3, hidden_dims=[4])
    >>> head(torch.zeros(2, 8)).shape
    torch.Size([2, 3])
    """

    def __init__(self, in_features: int, num_classes: int, hidden_dims=()):
        super().__init__()
        widths = [int(w) for w in hidden_dims]
        if any(w < 1 for w in widths):
            raise ValueError(f"model.hidden_dims={list(hidden_dims)} must be widths >= 1 (empty for a linear head)")
        layers, previous = [], in_features
        for width in widths:
            layers += [nn.Linear(previous, width), nn.ReLU()]
            previous = width
        layers.append(nn.Linear(previous, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
