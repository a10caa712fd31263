"""SinkhornSort: a soft permutation matrix from entropy-regularised optimal transport between the
scores and n sorted anchors (Cuturi, Teboul & Vert, NeurIPS 2019), in the "zero-to-one" form
Petersen et al. used ("sinkhorn_zto"), which difftopk no longer ships."""
from __future__ import annotations

import math

import torch

from topklab.operators.base import TopKOperator, check_scores


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
        Sinkhorn (row, column) normalisation rounds; more brings the marginals closer to 1.

    Examples
    --------
    >>> P = SinkhornSort(inverse_temperature=1e4, iterations=200).sort(torch.tensor([[0.3, -1.0, 2.0]]))
    >>> P.argmax(dim=1)   # the item at each ascending rank
    tensor([[1, 0, 2]])

    References
    ----------
    Cuturi et al., "Differentiable Ranks and Sorting using Optimal Transport", NeurIPS 2019, §3;
    Petersen et al., ICML 2022, §4 (SinkhornSort baseline).
    """

    def __init__(self, inverse_temperature: float = 1.0, iterations: int = 50):
        super().__init__()
        if not inverse_temperature > 0:
            raise ValueError(f"inverse_temperature={inverse_temperature} must be > 0 (larger = sharper)")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations={iterations!r} must be an int >= 1")
        self.inverse_temperature = float(inverse_temperature)
        self.iterations = iterations

    gives_permutation = True
    sums_to_k = True

    def extra_repr(self) -> str:
        return f"inverse_temperature={self.inverse_temperature}, iterations={self.iterations}"

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "SinkhornSort")
        return self.sort(scores)[:, :, -k:].flip(-1)

    def sort(self, scores: torch.Tensor) -> torch.Tensor:
        """The full soft ascending sort, (batch, n, n)."""
        check_scores(scores, 1, "SinkhornSort")
        n = scores.shape[1]
        centred = scores - scores.mean(dim=1, keepdim=True)
        spread = centred.square().mean(dim=1, keepdim=True).add(1e-12).sqrt()
        squashed = torch.sigmoid(centred / spread)
        anchors = (torch.arange(n, device=scores.device, dtype=scores.dtype) + 0.5) / n
        cost = (squashed[:, :, None] - anchors[None, None, :]).square()
        log_kernel = -cost * self.inverse_temperature
        log_marginal = -math.log(n)
        f = torch.zeros_like(squashed)
        g = torch.zeros_like(squashed)
        for _ in range(self.iterations):
            f = log_marginal - torch.logsumexp(log_kernel + g[:, None, :], dim=2)
            g = log_marginal - torch.logsumexp(log_kernel + f[:, :, None], dim=1)
        return torch.exp(log_kernel + f[:, :, None] + g[:, None, :] + math.log(n))
