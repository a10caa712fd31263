"""SoftSort (Prillo & Eisenschlos, ICML 2020) as a top-k operator."""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, positive


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

    Notes
    -----
    Extreme inputs (the rule of :mod:`topklab.operators.base`, which is SoftSort's own limit): the
    m₊ entries at +inf take ranks 1..m₊ (sharing them where several), a −inf entry gets 0, and
    column j >= m₊ is SoftSort's column over the finite entries centred on the row's (j+1)-th
    largest, i.e. the finite entries' permutation shifted by m₊; with fewer than k entries above −inf
    the −inf ones share the last ranks. A NaN score makes its row NaN; an empty batch gives an empty
    result. Distances are cut where ``|s_[j] − s|^p/τ`` exceeds 10⁴ (the softmax weight is 0 there
    anyway), so scores up to the dtype's maximum give finite P and finite gradients.

    Examples
    --------
    >>> SoftSort(tau=0.01).permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])
    >>> SoftSort(tau=0.01).permutation(torch.tensor([[0.1, float("inf"), -float("inf"), 1.0]]), 2).round()
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

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        # column j is centred on the row's (j+1)-th largest: the finite entries' (j+1−m₊)-th where finite
        largest = scores.topk(k, dim=1).values  # (batch, k)
        # beyond reach exp(−|d|^p/τ) is 0 in every dtype (float16: its maximum, 65504, is enough)
        reach = min((1e4 * self.tau) ** (1.0 / self.power), torch.finfo(scores.dtype).max)
        if rest is None:  # all finite: the masks below are identities, left out (the same bits)
            return torch.softmax(self._distance(largest, scores, reach) / -self.tau, dim=-1).transpose(1, 2)
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        centres = torch.where(torch.isfinite(largest), largest, zero)
        values = torch.where(rest.finite, scores, zero)
        logits = torch.where(rest.finite[:, None, :], self._distance(centres, values, reach) / -self.tau, -torch.inf)
        return torch.softmax(logits, dim=-1).transpose(1, 2)

    def _distance(self, centres: torch.Tensor, values: torch.Tensor, reach: float) -> torch.Tensor:
        """|centre − value|^power (batch, k, n), cut at ``reach``; power 1 without the pow (x¹ = x, bit for bit)."""
        distance = (centres[:, :, None] - values[:, None, :]).abs().clamp(max=reach)
        return distance if self.power == 1.0 else distance.pow(self.power)
