"""DFTopK: a sigmoid around the midpoint of the k-th and (k+1)-th largest scores (Zhu et al., 2025).

No sort and no normalisation: ``p = σ((x − t)/τ)`` with ``t = (x_[k] + x_[k+1])/2``, the two order
statistics found by selection in O(n). Σp is not k (only close to k when τ is small against the
gaps around the threshold).
"""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, plain, positive


class DFTopK(TopKOperator):
    """Soft top-k indicator ``p_i = σ((x_i − t)/τ)`` with ``t = (x_[k] + x_[k+1])/2``, where ``x_[j]`` is
    the j-th largest score of the row.

    The gradient reaches every x_i through ``(x_i − t)`` and the two order statistics through t
    (each gets ``−½·Σ_i σ'_i/τ``); at a tie of ``x_[k]`` and ``x_[k+1]`` autograd sends it to the
    index ``torch.kthvalue`` returns. The threshold needs k < n: for k = n there is no (k+1)-th
    score, the authors' code fails there (``kthvalue(k + 1)`` is out of range), and any rule would
    be arbitrary, so k = n is refused with a one-line error (select everything with ``hard_topk``).

    Parameters
    ----------
    temperature : float > 0
        τ, in units of the scores; the logits are ``(x − t)/τ``. Smaller is sharper: as τ → 0, p
        tends to the hard top-k indicator (exactly 0/1 in float64 once the gaps to t exceed ~750·τ).
        The authors' code divides by τ: ``dftopk(x, k, tau)`` in
        ``torch/deep_components/loss/two_stage/topk_loss.py`` computes ``logits = x + threshold``
        with ``threshold = −(x_[k] + x_[k+1])/2`` (from ``kthvalue(−x)``) and then
        ``logits / tau``. Default 1.0, that function's default; their RecFlow main runs use τ = 500
        on recommendation scores.

    Notes
    -----
    Extreme inputs (the rule of :mod:`topklab.operators.base`): a +inf score gets 1 and a −inf score 0,
    and the finite scores get DFTopK of the finite scores with k − m₊ (m₊ entries at +inf): the
    threshold is then the midpoint of the finite (k − m₊)-th and (k − m₊ + 1)-th largest, which are
    the row's k-th and (k+1)-th. Where no finite (k − m₊ + 1)-th exists (fewer than k + 1 entries
    above −inf), t is −inf, the limit, and every finite score gets 1. More than k entries at +inf
    share: k/m₊ each. A NaN score makes its row NaN; an empty batch gives an empty result. Scores up
    to the dtype's maximum stay finite (t is ``½x_[k] + ½x_[k+1]``, and ``(x − t)/τ`` saturates the
    sigmoid where it overflows).

    Examples
    --------
    >>> p = DFTopK(temperature=0.5).soft_topk(torch.tensor([[3.0, -1.0, 2.0, 0.0]]), k=2)
    >>> p.round(decimals=3)   # t = (2 + 0)/2 = 1
    tensor([[0.9820, 0.0180, 0.8810, 0.1190]])
    >>> DFTopK(temperature=1e-3).soft_topk(torch.tensor([[0.3, -1.0, 2.0]]), k=1)
    tensor([[0., 0., 1.]])
    >>> DFTopK(temperature=0.5).soft_topk(torch.tensor([[3.0, float("inf"), 2.0, 0.0]]), k=2)   # t = (3 + 2)/2
    tensor([[0.7311, 1.0000, 0.2689, 0.0067]])

    References
    ----------
    Zhu, Zhang, Wang, Wang, Li, Zhou, Wen, Jiang, Lin & Yang, "Differentiable Fast Top-K Selection
    for Large-Scale Recommendation", arXiv 2510.11472 (2025): ``θ(x) = (x_[k] + x_[k+1])/2`` and
    ``f_k(x) = σ((x − θ(x))/τ)``; code at github.com/zhangzhen97/DFTOPK.
    """

    sums_to_k = False

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.temperature = positive(temperature, "temperature", "smaller = sharper")

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"

    def check(self, scores: torch.Tensor, k: int) -> None:
        super().check(scores, k)
        if k == scores.shape[1]:
            raise ValueError(f"DFTopK needs k < n (its threshold uses the (k+1)-th largest score), got k = n = {k}")

    def threshold(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """t = midpoint of the k-th and (k+1)-th largest score of each row, (batch, 1) (±inf where
        those are; halves added, so that two scores near the dtype's maximum do not overflow)."""
        self.check(scores, k)
        n = scores.shape[1]
        # the k-th largest is the (n−k+1)-th smallest; torch.kthvalue is a linear-time selection
        kth = scores.kthvalue(n - k + 1, dim=1, keepdim=True).values
        next_ = scores.kthvalue(n - k, dim=1, keepdim=True).values
        return 0.5 * kth + 0.5 * next_

    def logits(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """``(x − t)/τ``, what the authors feed to ``binary_cross_entropy_with_logits`` (finite scores)."""
        return (scores - self.threshold(scores, k)) / self.temperature

    def _soft_topk(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        # the row's k-th and (k+1)-th largest are the finite rest's (k − m₊)-th and (k − m₊ + 1)-th,
        # or −inf where fewer entries lie above −inf; t is never +inf on the rows the core weighs
        t = self.threshold(scores, k)
        finite_t = torch.isfinite(t)
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        gap = torch.where(rest.finite, scores, zero) - torch.where(finite_t, t, zero)
        return torch.where(finite_t, torch.sigmoid(gap / self.temperature), torch.ones_like(gap))
