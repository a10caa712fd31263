"""SOFT top-k: top-k as an entropy-regularised optimal transport between the scores and a few
anchors, solved by log-domain Sinkhorn (Xie et al., NeurIPS 2020)."""
from __future__ import annotations

import math

import torch

from topklab.operators.base import TopKOperator, check_scores, positive

NORMALISE = ("batch", "row")  # what the cost is divided by: the batch's largest entry (the authors') or each row's


def _fill_negative_infinity(scores: torch.Tensor) -> torch.Tensor:
    """−inf scores (masked items) replaced, as in the authors' code, by ``min − (max − min)`` of the
    row's finite scores, a constant (no gradient) below every other item."""
    masked = scores == -torch.inf
    low = torch.where(masked, torch.full_like(scores, torch.inf), scores).amin(dim=1, keepdim=True)
    high = scores.amax(dim=1, keepdim=True)
    return torch.where(masked, (2 * low - high).detach(), scores)


def log_sinkhorn(cost: torch.Tensor, target: torch.Tensor, epsilon: float, max_iter: int,
                 tol: float) -> torch.Tensor:
    """The entropic transport plan Γ (batch, n, m) between uniform mass 1/n on the n rows of ``cost``
    and the m masses ``target`` (m,), for ``min ⟨C, Γ⟩ − ε·H(Γ)``.

    Log-domain Sinkhorn: each round rescales the rows, then the columns. The plan returned comes
    right after a column rescaling, so its column sums equal ``target`` to rounding; the rounds stop
    when the largest relative error of a row sum, ``|log(n·Σ_j Γ_ij)|``, is at most ``tol`` (never
    when tol = 0) or after ``max_iter`` rounds."""
    n = cost.shape[1]
    log_kernel = -cost / epsilon
    log_mu = -math.log(n)
    log_nu = target.log()[None, None, :]
    f = torch.zeros_like(cost[:, :, :1])
    g = log_nu - torch.logsumexp(log_kernel + f, dim=1, keepdim=True)
    for _ in range(max_iter):
        f_next = log_mu - torch.logsumexp(log_kernel + g, dim=2, keepdim=True)
        # f − f_next is log(n · row sum) of the current plan exp(K + f + g)
        if tol > 0 and bool((f_next - f).abs().max() <= tol):
            break
        f = f_next
        g = log_nu - torch.logsumexp(log_kernel + f, dim=1, keepdim=True)
    return torch.exp(log_kernel + f + g)


class SoftTopKOT(TopKOperator):
    """SOFT top-k: the top-k indicator as entropic optimal transport from the n scores (mass 1/n each)
    to anchors, solved by log-domain Sinkhorn; gradients by autograd through the iterations.

    :meth:`soft_topk` (the authors' ``TopK_custom``) transports onto two anchors 0 and 1 with
    masses ``k/n`` and ``(n − k)/n``, cost ``C_ij = (s_i − a_j)²`` divided by its largest entry
    over the whole batch, as a constant (the authors' ``C / C.max().detach()``), and
    returns ``p = n·Γ[:, anchor 0]``. The authors' operator selects the k *smallest* inputs (they
    use it on kNN distances), so it is applied to ``s = −x``: the k largest scores go to anchor 0.

    :meth:`permutation` (the authors' sorted variant ``TopK_custom1``) transports the raw scores onto
    k + 1 anchors ``k, k−1, …, 1, 0`` with masses ``1/n`` (ranks 1..k) and ``(n − k)/n`` (the rest),
    same normalised cost; column j is ``n·Γ[:, anchor k − j]``, the item at rank j + 1. The anchors
    are one unit apart on the scale of the raw scores, so the sharpness depends on that scale.

    Σp = k (and each permutation column sums to 1) holds to rounding after any number of rounds,
    because the plan is taken right after a column rescaling; ``tol`` bounds what is left, the
    error of the row sums: each item's total mass is 1 up to tol, so p_i <= 1 + tol. In float32 the
    row error cannot get much below ~1e-7/ε; a tol under that runs all ``max_iter`` rounds. k = n
    drops the anchor of zero mass: p = 1 and a full soft sort.

    Parameters
    ----------
    epsilon : float > 0
        ε, the entropic regularisation, relative to the largest (normalised) cost 1. Smaller is
        sharper, and Sinkhorn then needs more rounds: as ε → 0, p and the permutation tend to the
        hard ones. Default 0.1, the authors' default.
    max_iter : int >= 1
        Most Sinkhorn rounds (row then column rescaling). Default 200, the authors' default.
    tol : float >= 0
        Stop once every row sum is within this relative error; 0 always runs ``max_iter`` rounds
        (a fixed number of rounds makes the output a smooth function of the scores, as gradcheck
        needs). Default 1e-5.
    normalise : {"batch", "row"}
        The cost is divided by the largest entry of the batch (the authors'; a row's output then
        depends on the other rows) or of its own row (each row on its own scale). Either way the
        divisor is a constant for the gradient, as in the authors' code.

    Examples
    --------
    >>> x = torch.tensor([[3.0, -1.0, 2.0, 0.0]], dtype=torch.float64)
    >>> p = SoftTopKOT(epsilon=0.1).soft_topk(x, k=2)
    >>> p.round(decimals=3)
    tensor([[0.9240, 0.0760, 0.7770, 0.2230]], dtype=torch.float64)
    >>> round(float(p.sum()), 12)
    2.0
    >>> SoftTopKOT(epsilon=1e-3).permutation(torch.tensor([[0.3, -1.0, 2.0]]), k=2).argmax(dim=1)
    tensor([[2, 0]])

    References
    ----------
    Xie, Dai, Chen, Dai, Zhao, Zha, Wei & Pfister, "Differentiable Top-k with Optimal Transport",
    NeurIPS 2020: ``Γ* = argmin_{Γ ∈ Π(μ, ν)} ⟨C, Γ⟩ − ε·H(Γ)`` with ``μ = 1_n/n``,
    ``ν = [k/n, (n − k)/n]``, output ``A = n·Γ*[:, 0]`` (and the sorted variant with k + 1
    anchors); code in google-research ``soft_topk/soft_ot.py``.
    """

    gives_permutation = True
    sums_to_k = True

    def __init__(self, epsilon: float = 0.1, max_iter: int = 200, tol: float = 1e-5, normalise: str = "batch"):
        super().__init__()
        if normalise not in NORMALISE:
            raise ValueError(f"normalise={normalise!r}; choose one of {', '.join(NORMALISE)}")
        self.normalise = normalise
        self.epsilon = positive(epsilon, "epsilon", "smaller = sharper")
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter={max_iter!r} must be an int >= 1 (Sinkhorn rounds)")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ValueError(f"tol={tol!r} must be a number >= 0 (0 = always run max_iter rounds)")
        self.max_iter = max_iter
        self.tol = float(tol)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, max_iter={self.max_iter}, tol={self.tol}, normalise={self.normalise!r}"

    def _plan(self, points: torch.Tensor, anchors: list[float], masses: list[float]) -> torch.Tensor:
        anchors_ = points.new_tensor(anchors)
        cost = (points[:, :, None] - anchors_).square()
        largest = cost.amax() if self.normalise == "batch" else cost.amax(dim=(1, 2), keepdim=True)
        cost = cost / largest.detach().clamp_min(torch.finfo(cost.dtype).tiny)  # a constant, as the authors
        return log_sinkhorn(cost, points.new_tensor(masses), self.epsilon, self.max_iter, self.tol)

    def soft_topk(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "SoftTopKOT")
        n = scores.shape[1]
        anchors, masses = ([0.0, 1.0], [k / n, (n - k) / n]) if k < n else ([0.0], [1.0])
        plan = self._plan(-_fill_negative_infinity(scores), anchors, masses)
        return n * plan[:, :, 0]

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "SoftTopKOT")
        n = scores.shape[1]
        anchors = [float(k - j) for j in range(k + 1)]
        masses = [1.0 / n] * k + [(n - k) / n]
        if k == n:
            anchors, masses = anchors[:k], masses[:k]
        plan = self._plan(_fill_negative_infinity(scores), anchors, masses)
        return n * plan[:, :, :k]
