"""SOFT top-k: top-k as an entropy-regularised optimal transport between the scores and a few
anchors, solved by log-domain Sinkhorn (Xie et al., NeurIPS 2020)."""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, plain, positive
from topklab.utils.checks import check_int

NORMALISE = ("batch", "row")  # what the cost is divided by: the batch's largest entry (the authors') or each row's


def log_sinkhorn(
    cost: torch.Tensor, log_mu: torch.Tensor, log_nu: torch.Tensor, epsilon: float, max_iter: int, tol: float
) -> torch.Tensor:
    """The entropic transport plan Γ (batch, n, m) between the masses ``exp(log_mu)`` (batch, n, 1) on
    the n rows of ``cost`` and ``exp(log_nu)`` (batch, 1, m) on its m columns, for
    ``min ⟨C, Γ⟩ − ε·H(Γ)``. A mass may be 0 (log −inf): that row or column of Γ is 0 and takes no
    part; each row of the batch needs some mass on both sides.

    Log-domain Sinkhorn: each round rescales the rows, then the columns. The plan returned comes
    right after a column rescaling, so its column sums equal ``target`` to rounding; the rounds stop
    when the largest relative error of a row sum, ``|log(Σ_j Γ_ij / μ_i)|``, is at most ``tol`` (never
    when tol = 0) or after ``max_iter`` rounds."""
    log_kernel = -cost / epsilon
    weighed = torch.isfinite(log_mu)
    f = torch.where(weighed, 0.0, -torch.inf).to(cost.dtype)
    g = log_nu - torch.logsumexp(log_kernel + f, dim=1, keepdim=True)
    zero = torch.zeros((), dtype=cost.dtype, device=cost.device)
    for _ in range(max_iter):
        f_next = log_mu - torch.logsumexp(log_kernel + g, dim=2, keepdim=True)
        # f − f_next is log(row sum / μ) of the current plan exp(K + f + g)
        if tol > 0 and bool(torch.where(weighed, f_next - f, zero).abs().max() <= tol):
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
        divisor is a constant for the gradient, as in the authors' code. It is applied as
        ``((s − a)/max|s − a|)²``, the same number as ``C / C.max()`` without squaring first, so
        scores up to the dtype's maximum give a finite cost.

    Notes
    -----
    Extreme inputs: the rule of :mod:`topklab.operators.base`. +inf entries get 1 (ranks 1..m₊),
    −inf entries 0, and the finite entries get SOFT top-k of the finite entries alone: mass 1/n_f
    each, anchor masses for k' = k − m₊, and a cost normalised over the finite entries and the
    anchors with mass (so the normaliser of a batch skips the infinite entries, and the rows with
    nothing to weigh: NaN rows and rows with m₊ >= k). The operator's literal limit would not do:
    an infinite score makes every other normalised cost 0, so all finite entries would tie. The
    authors' code instead fills a −inf score with ``min − (max − min)`` of its row, which still
    gives it a small positive weight and stretches the normalisation; here it gets exactly 0. More
    than k entries at +inf share k/m₊ each, and with fewer than k entries above −inf the −inf ones
    share the rest. A NaN score makes its row NaN; an empty batch gives an empty result.

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
    >>> inf = float("inf")
    >>> x = torch.tensor([[3.0, -inf, 2.0, inf, 0.0, -1.0]], dtype=torch.float64)   # finite: the scores above
    >>> SoftTopKOT(epsilon=0.1).soft_topk(x, k=3).round(decimals=3)                    # with k − 1 = 2
    tensor([[0.9240, 0.0000, 0.7770, 1.0000, 0.2230, 0.0760]], dtype=torch.float64)

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
        check_int("max_iter", max_iter, why="Sinkhorn rounds")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ValueError(f"tol={tol!r} must be a number >= 0 (0 = always run max_iter rounds)")
        self.max_iter = max_iter
        self.tol = float(tol)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, max_iter={self.max_iter}, tol={self.tol}, normalise={self.normalise!r}"

    def _plan(self, points: torch.Tensor, rest, anchors: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        """Γ between the finite ``points`` (batch, n; mass 1/n_f each, 0 elsewhere) and the anchors
        (batch or 1, m) with ``masses`` (batch, m), the cost normalised over the entries with mass on
        both sides, of the rows that have something to weigh."""
        finite, count = rest.finite, rest.count
        gap = points[:, :, None] - anchors[:, None, :]  # (batch, n, m)
        weighed = (finite & rest.live)[:, :, None] & (masses > 0)[:, None, :]
        size = torch.where(weighed, gap.abs(), 0.0)
        largest = size.amax() if self.normalise == "batch" else size.amax(dim=(1, 2), keepdim=True)
        # ((s − a)/max|s − a|)² = C / C.max(), the divisor a constant as the authors'
        cost = (gap / largest.detach().clamp_min(torch.finfo(gap.dtype).tiny)).square()
        log_mu = torch.where(finite, -count.to(gap.dtype).log(), -torch.inf)[:, :, None]
        return log_sinkhorn(cost, log_mu, masses.log()[:, None, :], self.epsilon, self.max_iter, self.tol)

    def _soft_topk(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        count, chosen = rest.count.to(scores.dtype), rest.rest_k.to(scores.dtype)
        points = -torch.where(rest.finite, scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
        masses = torch.cat([chosen, count - chosen], dim=1) / count  # anchor 1 has no mass where k' = n_f
        plan = self._plan(points, rest, points.new_tensor([[0.0, 1.0]]), masses)
        return count * plan[:, :, 0]

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        count, chosen = rest.count.to(scores.dtype), rest.rest_k.to(scores.dtype)
        # anchor j < k is rank j − m₊ of the finite entries, at k' − (j − m₊) as the authors' k, k−1, …, 1;
        # anchor k, at 0, takes the n_f − k' others (no mass where k' = n_f)
        rank = torch.arange(k, device=scores.device, dtype=scores.dtype) - rest.top.to(scores.dtype)  # (batch, k)
        ranked = (rank >= 0) & (rank < chosen)
        anchors = torch.cat([chosen - rank, torch.zeros_like(count)], dim=1)
        masses = torch.cat([torch.where(ranked, 1.0, 0.0).to(scores.dtype), count - chosen], dim=1) / count
        points = torch.where(rest.finite, scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
        plan = self._plan(points, rest, anchors, masses)
        return count[:, :, None] * plan[:, :, :k]
