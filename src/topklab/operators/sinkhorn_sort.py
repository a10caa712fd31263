"""SinkhornSort: a soft permutation matrix from entropy-regularised optimal transport between the
scores and n sorted anchors (Cuturi, Teboul & Vert, NeurIPS 2019), in the "zero-to-one" form
Petersen et al. used ("sinkhorn_zto"), which difftopk no longer ships."""

from __future__ import annotations

import warnings

import torch

from topklab.operators.base import TopKOperator, plain, power_of_two_scale
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError

UNCONVERGED = ("warn", "raise", "ignore")
CHECK_EVERY = 10  # rounds between convergence checks (each check synchronises a GPU once)


class SinkhornSort(TopKOperator):
    """Soft sort by optimal transport: :meth:`sort` gives ``P[b, i, r]`` = how much of item i sits at
    ascending rank r (r = 0 is the smallest); :meth:`permutation` takes its k top ranks.

    The scores of each row are squashed to (0, 1) by a logistic of their standardised values, then
    transported onto n evenly spaced anchors ``(r + 1/2)/n`` with squared-distance cost and uniform
    marginals; the plan times n is doubly stochastic. The Sinkhorn iterations run in the log
    domain, so they stay finite for small ε.

    Parameters
    ----------
    inverse_temperature : float > 0
        1/ε. Larger is sharper: as it grows, ``P`` tends to the hard permutation of ``argsort``.
    iterations : int >= 1
        The budget of Sinkhorn (row, column) normalisation rounds.
    tol : float >= 0
        Stop once every item's total mass (a row sum of the plan times n, which the column
        rescaling leaves off 1) is within ``tol`` of 1, checked every 10 rounds; 0 always runs the
        whole budget. Larger inverse temperatures need more rounds (at 1e5 the error is still ~1
        after 3,000).
    unconverged : {"warn", "raise", "ignore"}
        What happens when the budget ends with a row sum further than ``tol`` from 1: a warning
        (once per operator), a one-line error, or nothing.

    Notes
    -----
    Extreme inputs: the rule of :mod:`topklab.operators.base`. The finite entries are sorted among
    themselves (standardised over the finite entries, n_f anchors ``(r + 1/2)/n_f``, mass 1/n_f each)
    into the ranks between the −inf entries (the lowest m₋) and the +inf ones (the highest m₊); tied
    infinities share their ranks evenly. The operator's literal limit would not do: the
    standardisation of a row with an infinite score sends every finite score to the same value. A
    NaN score makes its row NaN; an empty batch gives an empty result. The standardisation is
    scale-free, so each row is first divided by a power of two (exactly) and scores up to the dtype's
    maximum give finite plans. float16 and bfloat16 scores are computed in float32 (the 1e-12 that
    keeps the spread of a constant row above 0 is 0 in float16) and returned in their dtype.

    Examples
    --------
    >>> P = SinkhornSort(inverse_temperature=1e4, iterations=200).sort(torch.tensor([[0.3, -1.0, 2.0]]))
    >>> P.argmax(dim=1)   # the item at each ascending rank
    tensor([[1, 0, 2]])
    >>> inf = float("inf")
    >>> SinkhornSort(inverse_temperature=1e4, iterations=200).sort(torch.tensor([[0.3, inf, -1.0, -inf]])).argmax(dim=1)
    tensor([[3, 2, 0, 1]])

    References
    ----------
    Cuturi et al., "Differentiable Ranks and Sorting using Optimal Transport", NeurIPS 2019, §3;
    Petersen et al., ICML 2022, §4 (SinkhornSort baseline).
    """

    def __init__(
        self, inverse_temperature: float = 1.0, iterations: int = 50, tol: float = 1e-3, unconverged: str = "warn"
    ):
        super().__init__()
        if not inverse_temperature > 0:
            raise ValueError(f"inverse_temperature={inverse_temperature} must be > 0 (larger = sharper)")
        check_int("iterations", iterations)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ValueError(f"tol={tol!r} must be a number >= 0 (0 = always run every iteration)")
        if unconverged not in UNCONVERGED:
            raise ValueError(f"unconverged={unconverged!r}; choose one of {', '.join(UNCONVERGED)}")
        self.inverse_temperature = float(inverse_temperature)
        self.iterations, self.tol, self.unconverged = iterations, float(tol), unconverged
        self.last_error = None  # the largest |row sum − 1| of the last call
        self._warned = False

    gives_permutation = True
    sums_to_k = True

    def extra_repr(self) -> str:
        return f"inverse_temperature={self.inverse_temperature}, iterations={self.iterations}, tol={self.tol}"

    def sort(self, scores: torch.Tensor) -> torch.Tensor:
        """The full soft ascending sort, (batch, n, n): ``P[b, i, r]`` for ascending rank r."""
        return self.permutation(scores, scores.shape[1] if scores.dim() == 2 else 1).flip(-1)

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        rest = plain(scores, k) if rest is None else rest
        if scores.dtype in (torch.float16, torch.bfloat16):  # ε of the spread and 1/n_f marginals need float32
            return self._sort(scores.float(), rest)[:, :, -k:].flip(-1).to(scores.dtype)
        return self._sort(scores, rest)[:, :, -k:].flip(-1)

    def _sort(self, scores: torch.Tensor, rest) -> torch.Tensor:
        """The soft ascending sort of the finite entries of each row into the ranks ``m₋ .. m₋ + n_f − 1``
        (the m₋ entries at −inf below them, the +inf ones above); other ranks and items get 0."""
        n = scores.shape[1]
        finite, count = rest.finite, rest.count.to(scores.dtype)
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        values = torch.where(finite, scores, zero)
        scale = power_of_two_scale(values)  # exact; centred/spread does not change (with 1e-12 scaled too)
        values = values / scale
        centred = torch.where(finite, values - values.sum(1, keepdim=True) / count, zero)
        spread = (centred.square().sum(1, keepdim=True) / count + 1e-12 / scale.square()).sqrt()
        squashed = torch.sigmoid(centred / spread)
        ranks = torch.arange(n, device=scores.device, dtype=scores.dtype)
        lowest = (n - rest.count - rest.top).to(scores.dtype)  # m₋: the finite ranks start there
        anchored = (ranks >= lowest) & (ranks < lowest + count)  # (batch, n)
        anchors = (ranks - lowest + 0.5) / count
        cost = (squashed[:, :, None] - anchors[:, None, :]).square()
        log_kernel = -cost * self.inverse_temperature
        log_marginal = -count.log()
        log_mu = torch.where(finite, log_marginal, -torch.inf)  # (batch, n) items
        log_nu = torch.where(anchored, log_marginal, -torch.inf)  # (batch, n) ranks
        f = torch.where(finite, zero, -torch.inf)
        g = torch.where(anchored, zero, -torch.inf)
        for round_ in range(1, self.iterations + 1):
            f = log_mu - torch.logsumexp(log_kernel + g[:, None, :], dim=2)
            g = log_nu - torch.logsumexp(log_kernel + f[:, :, None], dim=1)
            if self.tol > 0 and (round_ % CHECK_EVERY == 0 or round_ == self.iterations):
                error = self._row_error(log_kernel, f, g, count, finite)
                if error <= self.tol:
                    break
        else:
            if self.tol > 0:
                self._report(error)
            else:
                error = self._row_error(log_kernel, f, g, count, finite)
        self.last_error = error
        return torch.exp(log_kernel + f[:, :, None] + g[:, None, :] + count.log()[:, :, None])

    @staticmethod
    def _row_error(log_kernel, f, g, count, finite) -> float:
        """max |n_f·Σ_r P_ir − 1| over the finite items, after the column rescaling (its columns are exact)."""
        with torch.no_grad():
            rows = torch.logsumexp(log_kernel + g[:, None, :], dim=2) + f + count.log()
            return float(torch.where(finite, rows.exp().sub(1).abs(), 0.0).max())

    def _report(self, error: float) -> None:
        if error <= self.tol or self.unconverged == "ignore":
            return
        message = (
            f"SinkhornSort did not converge: after {self.iterations} iterations a row sum is {error:.3g} from 1 "
            f"(tol {self.tol:g}); raise iterations or lower inverse_temperature={self.inverse_temperature:g}"
        )
        if self.unconverged == "raise":
            raise TopklabError(message)
        if not self._warned:
            self._warned = True
            warnings.warn(message, stacklevel=2)
