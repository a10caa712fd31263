from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses.individual.base import class_count_tensor


class CostSensitiveCE(nn.Module):
    """Per-sample class-weighted cross-entropy ``ℓ = w_y · (−log softmax(f(x))_y)`` with
    ``w_c ∝ n_c^(−power)``, normalised to mean 1 over the classes: the cost-sensitive (re-weighting)
    baseline of STk Table 7 ("CS"). No reduction.

    The STk paper does not define its CS loss; PEL/LIFT, whose code its vision runs build on, has
    none by that name, and its inverse-frequency re-weighting (``GRW``: w_c ∝ (n_c / N)^(−1), mean 1)
    is the textbook cost-sensitive loss, so ``power = 1`` takes its weights (per sample: an aggregate
    divides by the batch size, where GRW's weighted mean divides by the batch's weight sum).

    Parameters
    ----------
    class_counts : list of int > 0, training images per class (filled in from the dataset)
    power : float >= 0, how strongly rare classes are up-weighted (1: inverse frequency; 0: plain CE;
        0.5: square-root re-weighting)

    Examples
    --------
    >>> loss = CostSensitiveCE(class_counts=[3, 1], power=1.0)   # w = [0.5, 1.5]
    >>> loss(torch.zeros(2, 2), torch.tensor([0, 1])) / torch.log(torch.tensor(2.0))
    tensor([0.5000, 1.5000])
    """

    def __init__(self, class_counts: list[int] | None = None, power: float = 1.0):
        super().__init__()
        if not power >= 0:
            raise ValueError(f"power={power} must be >= 0")
        counts = class_count_tensor("CostSensitiveCE", class_counts)
        weights = counts.pow(-power)
        self.power = power
        self.register_buffer("class_weight", (weights / weights.mean()).float())

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.long()
        return self.class_weight.to(output.dtype)[target] * F.cross_entropy(output, target, reduction="none")
