"""STkThreshold: the STk threshold λ (Xia, Liu & Mao, NeurIPS 2024) as a soft top-k operator.

STk smooths the top-k sum ``min_λ Σ[x_i − λ]_+ + kλ`` with SReLU (Eq. 2, 3). The derivative of the
smoothed objective in x_i, ``p_i = SReLU'(x_i − λ) = ½(1 + (x_i − λ)/√((x_i − λ)² + δ²))``, is a
smooth step that is ≈ 1 above λ and ≈ 0 below: a soft top-k indicator once λ sits at the k-th
largest score. Two ways to get λ:

- ``"solved"``: per row, λ minimises Eq. 3, i.e. solves ``Σ_i SReLU'(x_i − λ) = k`` (a batched
  safeguarded Newton in torch), and is differentiated by the implicit-function theorem.
- ``"learned"``: λ is one trainable scalar (the paper's "module view", Fig. 1, trained with the
  model as in its SGD-STk), moved towards the k-th largest by the auxiliary
  :meth:`STkThreshold.objective`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from topklab.operators.base import TopKOperator, as_rows, plain, positive
from topklab.smoothing import srelu, srelu_slope_and_curvature
from topklab.utils.checks import check_int

THRESHOLDS = ("solved", "learned")


def srelu_slope(z: torch.Tensor, delta: float) -> torch.Tensor:
    """``SReLU'(z) = ½(1 + z/√(z² + δ²))``, computed without cancellation for z < 0.

    For z < 0 the formula subtracts two numbers close to 1; there ``½(1 + z/r) = δ²/(2r(r − z))``
    with ``r = √(z² + δ²)`` (multiply by (r − z)/(r − z)), which keeps full relative accuracy in the
    tail (at z = −10⁴, δ = 0.01 the naive form is off by 0.1 %).

    Examples
    --------
    >>> srelu_slope(torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64), 0.01)
    tensor([2.4998e-05, 5.0000e-01, 9.9998e-01], dtype=torch.float64)
    """
    return srelu_slope_and_curvature(z, torch.as_tensor(delta, dtype=z.dtype))[0]


def solve_threshold(
    scores: torch.Tensor, k: int, delta: float, tol: float = 1e-9, max_iter: int = 100, residual: bool = False
):
    """Per row of ``scores`` (batch, n), the λ with ``G(λ) = Σ_i SReLU'(x_i − λ) − k = 0``.

    G decreases in λ (``G' = −Σ ½δ²/r_i³ < 0``). The bracket starts as ``[min x − δ√(n/(p − k)),
    max x + δ√(n/(k − m))]`` over the finite scores, with m scores at +inf and p above −inf (G > 0 at
    its left end, G < 0 at its right end: ``SReLU'(z) <= δ²/(4z²)`` for z < 0, the argument of
    :func:`topklab.synthetic.topk_sum.stk_newton`), and λ starts halfway between the k-th and (k+1)-th
    largest scores. Each step moves the bracket end on λ's side to λ, then takes Newton's point where
    it lies strictly inside the bracket and the last step at least halved |G|, and the bracket's
    midpoint otherwise (so a stalling Newton is followed by a bisection). A row stops once
    ``|G| <= max(tol, 4·k·eps + n·eps₆₄)`` (eps of the working dtype: each term of Σp carries a
    relative rounding of a few eps; the sum itself is accumulated in float64, so its error does not
    grow with n), once Newton's step ``G/G'`` is below 4 units of λ's last place (see ``residual``),
    or once its step is below the dtype's resolution at λ. float16 and bfloat16 scores are solved
    in float32.

    Infinite scores: an entry at +inf adds 1 to Σ SReLU'(x − λ) at every λ and one at −inf adds 0
    (:func:`srelu_slope` saturates), so λ is the threshold of the finite scores with k − m. Rows
    without a root get λ = −inf where at most k scores lie above −inf (Σp < k for every λ; every
    row when k = n) and +inf where at least k scores are +inf.

    Returns λ of shape (batch,) in the working dtype, without a graph (see :class:`STkThreshold`
    for its gradient): the last λ at which G was evaluated. With ``residual=True`` also the Newton
    step left at that λ, ``G/G'`` (0 where it exceeds 4 units of λ's last place, and on rows
    without a root): ``x − λ − residual`` resolves λ below the dtype's resolution, which matters in
    float32 where many scores lie within δ of λ (one unit of λ's last place moves Σp by
    ``Σ SReLU''·ulp(λ)``, 3e-5 for k = 5 among 10⁶ normal scores).
    """
    with torch.no_grad():
        batch, n = scores.shape
        x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        if k >= n:
            lam = torch.full_like(x[:, 0], -math.inf)
            return (lam, torch.zeros_like(lam)) if residual else lam
        finite = torch.isfinite(x)
        plus = torch.isposinf(x).sum(1)
        present = plus + finite.sum(1)
        below, beyond = present <= k, plus >= k  # no root: λ = −inf, λ = +inf
        least = torch.where(finite, x, math.inf).amin(1)
        most = torch.where(finite, x, -math.inf).amax(1)
        least, most = torch.where(finite.any(1), least, 0.0), torch.where(finite.any(1), most, 0.0)
        low = least - delta * torch.sqrt(n / (present - k).clamp(min=1).to(x.dtype))
        high = most + delta * torch.sqrt(n / (k - plus).clamp(min=1).to(x.dtype))
        top = x.topk(k + 1, dim=1).values
        start = 0.5 * top[:, k - 1] + 0.5 * top[:, k]  # halves: no overflow near the maximum
        lam = torch.minimum(torch.maximum(torch.where(torch.isnan(start), low, start), low), high)
        previous = torch.full_like(lam, math.inf, dtype=torch.float64)
        eps = torch.finfo(x.dtype).eps
        tol = max(tol, 4 * k * eps + n * torch.finfo(torch.float64).eps)  # Σp cannot be nearer k than this
        width = torch.as_tensor(delta, dtype=x.dtype)
        active = ~(below | beyond)
        for _ in range(max_iter):
            slope, curvature = srelu_slope_and_curvature(x - lam[:, None], width)
            excess = slope.sum(1, dtype=torch.float64) - k
            evaluated, step_left = lam, excess / curvature.sum(1, dtype=torch.float64)
            # done where Σp is within tol of k, or Newton's step is below λ's resolution (the residual takes it)
            fine = step_left.abs() <= 4 * eps * torch.maximum(lam.abs(), torch.full_like(lam, delta))
            active = active & (excess.abs() > tol) & ~fine
            if not bool(active.any()):
                break
            low = torch.where(active & (excess > 0), lam, low)
            high = torch.where(active & (excess <= 0), lam, high)
            newton = lam + step_left.to(x.dtype)
            use_newton = (newton > low) & (newton < high) & (excess.abs() <= 0.5 * previous)
            step = torch.where(use_newton, newton, 0.5 * low + 0.5 * high)
            previous = excess.abs()
            resolved = (step - lam).abs() <= 2 * eps * torch.maximum(lam.abs(), torch.full_like(lam, delta))
            lam = torch.where(active, step, lam)
            active = active & ~resolved
        lam = torch.where(below, -math.inf, torch.where(beyond, math.inf, evaluated))
        if not residual:
            return lam
        return lam, torch.where(fine & torch.isfinite(lam), step_left, 0.0).to(x.dtype)


class STkThreshold(TopKOperator):
    """Soft top-k ``p_i = SReLU'(x_i − λ)`` with the STk threshold λ, solved per row or learned.

    Parameters
    ----------
    delta : float > 0
        SReLU's width δ (the paper uses 0.01). Smaller is sharper: items farther than a few δ from
        λ get p within ``δ²/(4(x_i − λ)²)`` of 0 or 1, and δ → 0 gives the hard top-k on distinct
        scores. The step has width ~δ in score units, so δ must be small next to the gaps between
        scores for p to be nearly hard, and comparable to them for useful gradients.
    threshold : {"solved", "learned"}
        "solved": per row, λ minimises the smoothed top-k objective Eq. 3, ``Σ SReLU(x_i − λ) + kλ``,
        i.e. ``Σ_i p_i = k``, found by a batched safeguarded Newton in torch
        (:func:`solve_threshold`); λ is differentiated by the implicit-function theorem,
        ``∂λ/∂x_j = h_j / Σ_i h_i`` with ``h = SReLU''(x − λ) = ½δ²/r³``, so gradients of p are exact
        (to first order: the second derivative of λ is not represented). For k = n there is no
        solution (Σp < n for every λ) and p is the hard limit, all ones. The sums of the solver are
        accumulated in float64 whatever the scores' dtype (float16 and bfloat16 are solved and
        evaluated in float32, p returned in their dtype).
        "learned": λ is one ``nn.Parameter`` of the module, shared by all rows, initialised at
        ``lam_init`` and trained by the optimiser that trains the model; add :meth:`objective` to
        the loss so that it tracks the k-th largest score (the paper's SGD-STk, Fig. 1). Here
        ``soft_topk`` uses the current λ whatever k is (k enters through the objective only).
    lam_init : float
        "learned" only: the starting λ (the paper does not say how it initialises λ).
    tol : float > 0
        "solved" only: stop once ``|Σp − k| <= max(tol, 4·k·eps + n·eps₆₄)`` (or λ's step drops
        below the dtype's resolution).
    max_iter : int >= 1
        "solved" only: the most Newton/bisection steps.

    Notes
    -----
    ``sums_to_k`` is False: for "solved", Σp = k holds to the solver's tolerance
    ``max(tol, 4·k·eps + n·eps₆₄)`` (eps of the scores' dtype: 1e-9 in float64; 2.4e-6 for k = 5 in
    float32 at any n, since Σp is accumulated in float64: a float32 sum gave Σp = 7.56 for k = 5 at
    n = 10⁷, where the old bound 4·n·eps was 4.8), not exactly; for "learned", Σp is whatever the
    current λ gives.

    Extreme inputs, "solved": STk's equation gives the rule of :mod:`topklab.operators.base` as its
    exact limit (SReLU'(+inf − λ) = 1 and SReLU'(−inf − λ) = 0 at every λ), so λ is the threshold of
    the finite scores with k − m₊ (m₊ at +inf); +inf entries get 1, −inf entries 0, more than k at
    +inf share k/m₊ each, and with at most k entries above −inf λ = −inf and every finite entry gets
    1 (the −inf ones share what is missing). A NaN score makes its row NaN; an empty batch gives an
    empty result; scores up to the dtype's maximum stay finite (z² is not formed where it would
    overflow). "learned" works elementwise, whatever k: p = SReLU'(x − λ) is 1 at +inf, 0 at −inf
    and NaN at NaN (only that entry).

    Examples
    --------
    >>> x = torch.tensor([[3.0, 1.0, 2.0, -1.0]], dtype=torch.float64)
    >>> op = STkThreshold(delta=0.01)
    >>> p = op.soft_topk(x, k=2)
    >>> p.round(decimals=3), round(float(p.sum()), 12)
    (tensor([[1., 0., 1., 0.]], dtype=torch.float64), 2.0)
    >>> op.threshold(x, k=2)   # between the 2nd and 3rd largest, nearer the side with more tail mass
    tensor([1.4913], dtype=torch.float64)
    >>> learned = STkThreshold(delta=0.01, threshold="learned", lam_init=1.5)
    >>> learned.soft_topk(x, k=2).detach().round(decimals=3)
    tensor([[1., 0., 1., 0.]], dtype=torch.float64)
    >>> learned.objective(x, k=2).backward()   # add this to the loss: it moves λ towards the k-th largest
    >>> learned.lam.grad   # (k − Σp)/n: λ = 1.5 already gives Σp ≈ k
    tensor(1.7777e-06)
    >>> extreme = torch.tensor([[3.0, float("inf"), 2.0, -float("inf")]], dtype=torch.float64)
    >>> op.soft_topk(extreme, k=2).round(decimals=3)   # +inf: 1; the finite [3, 2] with k = 1
    tensor([[1., 1., 0., 0.]], dtype=torch.float64)

    References
    ----------
    Xia, Liu & Mao, "ST_k: A Scalable Module for Solving Top-k Problems", NeurIPS 2024: SReLU
    (Eq. 2), the smoothed top-k objective (Eq. 3) whose minimiser in λ is the soft k-th largest,
    and λ as a trainable parameter updated with the model (SGD-STk, Fig. 1). Ogryczak & Tamir,
    "Minimizing the sum of the k largest functions in linear time", IPL 2003 (Eq. 1).
    """

    def __init__(
        self,
        delta: float = 0.01,
        threshold: str = "solved",
        lam_init: float = 0.0,
        tol: float = 1e-9,
        max_iter: int = 100,
    ):
        super().__init__()
        self.delta = positive(delta, "delta", "smaller = sharper")
        if threshold not in THRESHOLDS:
            raise ValueError(f"threshold={threshold!r} is unknown; choose one of {', '.join(THRESHOLDS)}")
        if isinstance(lam_init, bool) or not isinstance(lam_init, (int, float)) or not math.isfinite(lam_init):
            raise ValueError(f"lam_init={lam_init!r} must be a finite number")
        check_int("max_iter", max_iter)
        self.threshold_mode = threshold
        self.tol = positive(tol, "tol", "smaller = Σp closer to k")
        self.max_iter = max_iter
        self.lam = nn.Parameter(torch.tensor(float(lam_init))) if threshold == "learned" else None

    def extra_repr(self) -> str:
        return f"delta={self.delta}, threshold={self.threshold_mode!r}"

    def threshold(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """λ per row (batch,): solved (differentiable in the scores; ±inf where the row has no root,
        NaN on a row with a NaN score) or the learned parameter (broadcast)."""
        self.check(scores, k)
        if self.threshold_mode == "learned":
            return self.lam.to(scores.dtype).expand(scores.shape[0])
        finite, nan = torch.isfinite(scores), torch.isnan(scores)
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        lam, _ = self._solved(torch.where(nan, zero, torch.where(finite, scores, scores.detach())), k, finite)
        return torch.where(nan.any(1), torch.nan, lam.to(scores.dtype))

    def _solved(self, scores: torch.Tensor, k: int, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """λ of each row of NaN-free ``scores`` (infinite entries detached), in the working dtype, and
        the residual Newton step below its resolution (see :func:`solve_threshold`)."""
        x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        lam, residual = solve_threshold(x, k, self.delta, self.tol, self.max_iter, residual=True)
        if not x.requires_grad:
            return lam, residual
        safe = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
        with torch.no_grad():
            curvature = srelu_slope_and_curvature(safe - lam[:, None], torch.as_tensor(self.delta, dtype=x.dtype))[1]
            curvature = torch.where(finite, curvature, 0.0)  # an infinite score does not move λ
            weight = curvature / curvature.sum(1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        # value λ*, gradient ∂λ/∂x = h/Σh (implicit-function theorem on Σ SReLU'(x − λ) = k)
        return lam + (weight * (safe - safe.detach())).sum(1), residual

    def soft_topk(self, scores: torch.Tensor, k: int | float, dim: int = -1) -> torch.Tensor:
        if self.threshold_mode == "learned":  # elementwise, whatever k (see the class docstring)
            rows, k, _ = as_rows(scores, k, dim, type(self).__name__)
            self.check(rows, (int(k.max()) if k.numel() else 1) if isinstance(k, torch.Tensor) else k)
            return srelu_slope(scores - self.lam.to(scores.dtype), self.delta)
        return super().soft_topk(scores, k, dim)

    def _soft_topk(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        lam, residual = self._solved(x, k, rest.finite)  # λ = −inf where at most k entries lie above −inf: p = 1
        safe = torch.where(rest.finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
        return srelu_slope(safe - lam[:, None] - residual[:, None], self.delta).to(scores.dtype)

    def objective(self, scores: torch.Tensor, k: int, detach_scores: bool = True) -> torch.Tensor:
        """STk's loss (Eq. 6) on the scores: the mean over rows of ``(1/n)Σ SReLU(x_i − λ) + (k/n)λ``.

        Minimised over λ it puts λ at the soft k-th largest score of (on average) the rows; add it to
        the training loss to train a "learned" λ. With ``detach_scores`` (the default) only λ gets
        its gradient, so the term does not push the scores themselves down; ``detach_scores=False``
        is the paper's STk aggregate of the scores. For "solved", λ is already the minimiser per row
        and the value is the smoothed top-k sum divided by n.
        """
        lam = self.threshold(scores.detach() if detach_scores else scores, k)
        x = scores.detach() if detach_scores else scores
        if self.threshold_mode == "solved" and k == scores.shape[1]:
            return (x.mean(1) - 0.5 * self.delta).mean()  # the limit λ → −∞: SReLU(z) = z − δ/2 + o(1)
        n = scores.shape[1]
        return (srelu(x - lam[:, None], self.delta).sum(1) / n + (k / n) * lam).mean()
