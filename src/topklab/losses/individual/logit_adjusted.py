from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.individual.base import class_count_tensor


class LogitAdjusted(nn.Module):
    """Per-sample logit-adjusted cross-entropy ``ℓ = −log softmax(f(x) + τ·log π)_y`` (Menon et al.
    2021, Eq. 10), where π is the class prior of the training set. No reduction.

    Parameters
    ----------
    class_counts : list of int, training images per class (filled in from the dataset)
    tau : float >= 0, the adjustment's strength (1 = the paper's and PEL's choice; 0 = plain CE)

    Examples
    --------
    >>> loss = LogitAdjusted(class_counts=[3, 1], tau=1.0)
    >>> loss(torch.zeros(1, 2), torch.tensor([1]))   # −log(1/4): the rare class must win by log 3
    tensor([1.3863])
    """

    def __init__(self, class_counts: list[int] | None = None, tau: float = 1.0):
        super().__init__()
        if not tau >= 0:
            raise ValueError(f"tau={tau} must be >= 0")
        counts = class_count_tensor("LogitAdjusted", class_counts)
        self.tau = tau
        self.register_buffer("log_prior", (counts / counts.sum()).log().float())

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        adjusted = output + self.tau * self.log_prior.to(output.dtype)
        return F.cross_entropy(adjusted, target.long(), reduction="none")
