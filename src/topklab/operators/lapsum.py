"""LapSum: soft top-k from the closed-form inverse of a sum of Laplace CDFs (Struski et al., ICML 2025).

With the Laplace CDF ``F(t) = ½·e^t`` (t <= 0), ``1 − ½·e^(−t)`` (t > 0) and the scores divided by
the scale α, ``y = x/α``, the soft top-k indicator is ``p_i = F(y_i − c)``, where the threshold c
solves ``S(c) = Σ_i F(y_i − c) = k``. S decreases strictly in c, and on each interval between two
consecutive sorted scores it is ``½·e^(−c)·A + m − ½·e^c·B`` (m items above c, ``A = Σ_{y_i <= c} e^(y_i)``,
``B = Σ_{y_i > c} e^(−y_i)``), so ``u = e^c`` is the positive root of ``B·u² − 2(m − k)·u − A = 0``.
One sort, prefix log-sum-exps, one ``searchsorted`` for the interval and that root, all in log space.
"""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, plain, positive


def laplace_cdf(t: torch.Tensor) -> torch.Tensor:
    """``F(t) = ½·e^t`` for t <= 0 and ``1 − ½·e^(−t)`` for t > 0, with the derivative ½ at t = 0
    (``exp(−|t|)`` would give autograd's 0 there, since ``|t|`` has derivative 0 at 0)."""
    lower = 0.5 * torch.exp(t.clamp(max=0.0))
    upper = 1.0 - 0.5 * torch.exp((-t).clamp(max=0.0))
    return torch.where(t <= 0, lower, upper)


def _solve_threshold(y: torch.Tensor, targets: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The c of ``Σ_i F(y_i − c) = target`` for each row of y (batch, n) and each of its targets
    (batch, K): (batch, K). Entries of y at −inf are absent (they add F = 0 at every c); ``count``
    (batch, 1) is the number of the others, at least 1.

    A target >= count has no finite solution (S(c) < count for every c); its c is −inf, where every
    present p_i is 1. A target <= 0 has c = +inf, where every p_i is 0."""
    batch, n = y.shape
    ys = y.sort(dim=1).values  # the absent entries first
    present = torch.arange(n, device=y.device) >= n - count  # (batch, n), in sorted order
    neg_inf = ys.new_full((batch, 1), -torch.inf)
    low = torch.logcumsumexp(ys, dim=1)  # log Σ_{i <= j} e^(ys_i)
    high = torch.logcumsumexp(-ys.flip(1), dim=1).flip(1)  # log Σ_{i >= j} e^(−ys_i)
    high_next = torch.cat([high[:, 1:], neg_inf], dim=1)
    above = torch.arange(n - 1, -1, -1, device=y.device, dtype=y.dtype)
    # S at each present breakpoint c = ys_j (both exponents are <= log n, so nothing overflows); at
    # an absent one (c = −inf) S is count, above every target that has a finite root
    at_breakpoints = 0.5 * torch.exp(low - ys) + above - 0.5 * torch.exp(ys + high_next)
    at_breakpoints = torch.where(present, at_breakpoints, torch.inf)
    at_breakpoints = at_breakpoints.cummin(dim=1).values  # exactly non-increasing for searchsorted
    targets = targets.to(y.dtype).contiguous()
    # below = #{j : S(ys_j) >= k}: the root lies in [ys_{below−1}, ys_below)
    below = torch.searchsorted(-at_breakpoints.contiguous(), -targets, right=True)
    log_a = torch.cat([neg_inf, low], dim=1).gather(1, below)  # log Σ e^(y_i) over the items below c
    log_b = torch.cat([high, neg_inf], dim=1).gather(1, below)  # log Σ e^(−y_i) over the items above c
    d = (n - below).to(y.dtype) - targets  # m − k
    log_d = d.abs().log()
    # log(|d| + sqrt(d² + A·B)), then the root written without cancellation for either sign of d
    log_root = torch.logaddexp(log_d, 0.5 * torch.logaddexp(2.0 * log_d, log_a + log_b))
    c = torch.where(d >= 0, log_root - log_b, log_a - log_root)
    c = torch.where(targets >= count, torch.full_like(c, -torch.inf), c)
    return torch.where(targets <= 0, torch.full_like(c, torch.inf), c)


def _threshold_weights(y: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """dc/dy_i = F'(y_i − c) / Σ_j F'(y_j − c) = softmax_i(−|y_i − c|), (batch, n, K); 0 where c = ±inf
    and at the absent entries (y = −inf)."""
    finite = torch.isfinite(c)[:, None, :]
    gap = torch.where(finite, y[:, :, None] - c[:, None, :], torch.zeros((), dtype=y.dtype, device=y.device))
    return torch.where(finite, torch.softmax(-gap.abs(), dim=1), torch.zeros((), dtype=y.dtype, device=y.device))


class _LaplaceThreshold(torch.autograd.Function):
    """c(y) with the implicit-function-theorem gradient ``dc/dy_i = F'_i / Σ_j F'_j``.

    The backward is written in differentiable ops on the saved output c, so double backward
    (Hessian-vector products) is exact as well."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, targets: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        c = _solve_threshold(y.detach(), targets, count)
        ctx.save_for_backward(y, c)
        return c

    @staticmethod
    def backward(ctx, grad_c: torch.Tensor):
        y, c = ctx.saved_tensors
        return (_threshold_weights(y, c) * grad_c[:, None, :]).sum(-1), None, None


class LapSum(TopKOperator):
    """Soft top-k by inverting a sum of Laplace CDFs: ``p_i = F((x_i − b)/α)`` with the b for which
    ``Σ_i p_i = k`` exactly, found in closed form.

    ``b`` is differentiated by the implicit-function theorem, ``db/dx_i = F'_i / Σ_j F'_j`` with
    ``F'_i = F'((x_i − b)/α)``, so autograd gives the exact derivatives of p (checked by
    ``torch.autograd.gradcheck``). :meth:`permutation` takes differences of nested soft top-j
    indicators: column j is ``p^(j+1) − p^(j)`` (``p^(0) = 0``); every column sums to 1, the k
    columns of a row sum to ``p^(k)_i <= 1``, and all k thresholds come from one sort.

    Cost: one sort, O(n log n) time and O(n) memory per row for :meth:`soft_topk`; O(n·k) memory
    for :meth:`permutation`. Rows are independent; k = n gives p = 1 everywhere.

    Extreme inputs: LapSum's equation gives the rule of :mod:`topklab.operators.base` as its exact
    limit (an entry at +inf adds F = 1 to ``Σ_i F`` at every b, one at −inf adds 0), so the finite
    entries get LapSum of the finite entries with k − m₊ (m₊ entries at +inf), +inf entries 1 and
    −inf entries 0; more than k entries at +inf share, k/m₊ each, and with fewer than k entries above
    −inf the finite ones get 1 and the −inf ones share the rest. A NaN score makes its row NaN; an
    empty batch gives an empty result. The scores are shifted by the k-th largest finite score
    before the division by α, so finite scores up to the dtype's maximum give finite p.

    Parameters
    ----------
    alpha : float > 0
        Scale α of the Laplace CDF, in units of the scores. Smaller is sharper: as α → 0, p tends to
        the hard top-k indicator (items whose scores differ from b by more than ~40·α get exactly
        0 or 1 in float64). The authors' pure-PyTorch version also divides the scores by α. Default
        1.0, the value the DFTopK authors run their LapSum baseline with.

    Examples
    --------
    >>> p = LapSum(alpha=0.5).soft_topk(torch.tensor([[3.0, -1.0, 2.0, 0.0]], dtype=torch.float64), k=2)
    >>> p.round(decimals=3)
    tensor([[0.9910, 0.0090, 0.9320, 0.0680]], dtype=torch.float64)
    >>> float(p.sum())
    2.0
    >>> LapSum(alpha=1e-3).permutation(torch.tensor([[0.3, -1.0, 2.0]]), k=2).argmax(dim=1)
    tensor([[2, 0]])
    >>> inf = float("inf")
    >>> LapSum(alpha=0.5).soft_topk(torch.tensor([[3.0, -inf, 2.0, inf]], dtype=torch.float64), k=2).round(decimals=3)
    tensor([[0.8160, 0.0000, 0.1840, 1.0000]], dtype=torch.float64)

    References
    ----------
    Struski, Bednarczyk, Podolak & Tabor, "LapSum — One Method to Differentiate Them All: Ranking,
    Sorting and Top-k Selection", ICML 2025 (arXiv 2503.06242): ``LapSum_α(b) = Σ_i F_α(b − r_i)``,
    soft top-k ``p_i = F_α(LapSum_α^{-1}(k) − r_i)`` with the closed-form inverse, and the soft
    permutation as differences ``F_α(b_{j+1} − r_i) − F_α(b_j − r_i)``. Here the sign is flipped
    (``F((x_i − b)/α)``) so that larger scores are selected.
    """

    gives_permutation = True
    sums_to_k = True

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = positive(alpha, "alpha", "smaller = sharper")

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    def thresholds(self, scores: torch.Tensor, ks) -> torch.Tensor:
        """The scaled thresholds ``c = b/α`` for each row and each k in ``ks`` (ints in 1..n): (batch, len(ks)).
        Finite scores (this is the raw solver; :meth:`soft_topk` applies the rules for ±inf)."""
        y = scores / self.alpha
        ks = torch.as_tensor(ks, dtype=scores.dtype, device=scores.device).reshape(1, -1).expand(len(y), -1)
        return _LaplaceThreshold.apply(y, ks, torch.full_like(y[:, :1], y.shape[1], dtype=torch.long))

    def _scaled(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        """``y = (x − r)/α`` on the finite entries and −inf on the others, with r the finite entries'
        k'-th largest (detached: LapSum depends on differences of scores only), so that y overflows
        only where a score is beyond the dtype's range from r; there y is cut at ±max/8, where p is
        already exactly 0 or 1."""
        n = scores.shape[1]
        values = scores.detach()
        kth = values.kthvalue(n - k + 1, dim=1, keepdim=True).values  # the finite k'-th largest, or −inf
        least = torch.where(rest.finite, values, torch.inf).amin(1, keepdim=True)
        most = torch.where(rest.finite, values, -torch.inf).amax(1, keepdim=True)
        reference = torch.minimum(torch.maximum(kth, least), most)
        big = torch.finfo(scores.dtype).max / 8
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        y = ((torch.where(rest.finite, scores, zero) - reference) / self.alpha).clamp(-big, big)
        return torch.where(rest.finite, y, -torch.inf)

    def _soft_topk(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        y = self._scaled(scores, k, rest)
        c = _LaplaceThreshold.apply(y, rest.rest_k.to(y.dtype), rest.count)
        return laplace_cdf(torch.where(rest.finite, y - c, torch.zeros((), dtype=y.dtype, device=y.device)))

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        y = self._scaled(scores, k, rest)
        # column j is rank j − m₊ of the finite entries: the nested top-(j + 1 − m₊) thresholds
        targets = torch.arange(1, k + 1, device=y.device, dtype=y.dtype) - rest.top.to(y.dtype)  # (batch, k)
        c = _LaplaceThreshold.apply(y, targets, rest.count)
        gap = torch.where(
            rest.finite[:, :, None], y[:, :, None] - c[:, None, :], torch.zeros((), dtype=y.dtype, device=y.device)
        )
        nested = laplace_cdf(gap)  # p^(1), ..., p^(k)
        return torch.diff(nested, dim=2, prepend=torch.zeros_like(nested[:, :, :1]))
