"""SoftSort (Prillo & Eisenschlos, ICML 2020) as a top-k operator."""
from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, check_scores, positive


class SoftSort(TopKOperator):
    """Relaxed top-k permutation from SoftSort: column j is ``softmax(−|s_[j] − s|^p / τ)`` over the
    items, with s_[j] the (j+1)-th largest score (Prillo & Eisenschlos, Eq. 3). The sorted scores
    are not differentiated through the sort's indices, only through their values.

    Parameters
    ----------
    tau : float > 0
        Temperature; smaller is sharper. difftopk's ``--inverse_temperature`` is 1/τ (0.0625 on
        CIFAR-100, i.e. τ = 16).
    power : float > 0
        Exponent p of the distance (1 in the paper and in difftopk).

    Examples
    --------
    >>> SoftSort(tau=0.01).permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])

    References
    ----------
    Prillo & Eisenschlos, "SoftSort: A Continuous Relaxation for the argsort Operator", ICML 2020,
    Eq. 3; Petersen et al., ICML 2022 (SoftSort baseline, difftopk's ``SoftSort``).
    """

    gives_permutation = True
    sums_to_k = True
    bounded = False  # per-rank stochastic, not per item: an entry of p can exceed 1 (see operators.base)

    def __init__(self, tau: float = 1.0, power: float = 1.0):
        super().__init__()
        self.tau = positive(tau, "tau", "smaller is sharper")
        self.power = positive(power, "power", "the exponent of |s_[j] − s|")

    def extra_repr(self) -> str:
        return f"tau={self.tau}, power={self.power}"

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "SoftSort")
        largest = scores.topk(k, dim=1).values                                       # (batch, k)
        distance = (largest[:, :, None] - scores[:, None, :]).abs().pow(self.power)
        return torch.softmax(-distance / self.tau, dim=-1).transpose(1, 2)
