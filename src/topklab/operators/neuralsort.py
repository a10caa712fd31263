"""NeuralSort (Grover, Wang, Zweig & Ermon, ICLR 2019) as a top-k operator."""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, positive, power_of_two_scale


class NeuralSort(TopKOperator):
    """Relaxed top-k permutation from NeuralSort's unimodal row-stochastic matrix.

    Row r (the r-th largest, r = 1..n) of the relaxed sort matrix is
    ``softmax(((n + 1 − 2r)·s − A_s·1) / τ)`` with ``A_s[i, j] = |s_i − s_j|`` (Grover et al.,
    Eq. 4–5); column j − 1 of the top-k permutation is row j, so only k rows are built (O(n² + nk)
    time for A_s·1). Each column sums to 1 over the items, so the soft top-k sums to k; an item's
    row may exceed 1 (the matrix is row-stochastic in ranks, not doubly stochastic).

    Parameters
    ----------
    tau : float > 0
        Temperature; smaller is sharper (τ → 0 gives the hard sort). difftopk's
        ``--inverse_temperature`` is 1/τ (Petersen et al. use 0.0625 on CIFAR-100, i.e. τ = 16).

    Notes
    -----
    Extreme inputs (the rule of :mod:`topklab.operators.base`, which is NeuralSort's own limit: a
    score at +inf wins rank 1, and the common −M it adds to every other item's logits cancels in the
    softmax): the m₊ entries at +inf take ranks 1..m₊ (sharing them where several), a −inf entry
    gets 0, and the finite entries get NeuralSort's relaxed sort of the finite entries alone (n_f of
    them in the formula) in the ranks after m₊; with fewer than k entries above −inf the −inf ones
    share the last ranks. A NaN score makes its row NaN; an empty batch gives an empty result. The
    logits are 1-homogeneous in s, so they are formed on s/c (c a power of two) and the softmax
    takes ``(logits − max)·c/τ``: scores up to the dtype's maximum give finite P. (Finite scores far
    apart, e.g. 1e30 beside O(1) ones, still lose the small ones' differences to rounding in A_s·1.)

    Examples
    --------
    >>> NeuralSort(tau=0.01).permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])
    >>> NeuralSort(tau=0.01).permutation(torch.tensor([[0.1, float("inf"), -float("inf"), 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])

    References
    ----------
    Grover et al., "Stochastic Optimization of Sorting Networks via Continuous Relaxations", ICLR
    2019, Eq. 5; Petersen et al., ICML 2022 (NeuralSort baseline, difftopk's ``NeuralSort``).
    """

    gives_permutation = True
    sums_to_k = True
    bounded = False  # per-rank stochastic, not per item: an entry of p can exceed 1 (see operators.base)

    def __init__(self, tau: float = 1.0):
        super().__init__()
        self.tau = positive(tau, "tau", "smaller is sharper")

    def extra_repr(self) -> str:
        return f"tau={self.tau}"

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        if rest is None:
            return self._finite_permutation(scores, k)
        finite = rest.finite
        values = torch.where(finite, scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
        scale = power_of_two_scale(values)  # (batch, 1)
        s = values / scale
        # A_s·1 over the finite j: the non-finite entries sit at s = 0, each adding |s_i| to the full sum
        absent = (scores.shape[1] - rest.count).to(scores.dtype)
        spread = (s[:, :, None] - s[:, None, :]).abs().sum(-1) - absent * s.abs()
        # column j is rank r = j + 1 − m₊ of the n_f finite entries
        ranks = torch.arange(1, k + 1, device=scores.device, dtype=scores.dtype) - rest.top.to(scores.dtype)
        weights = rest.count.to(scores.dtype) + 1 - 2 * ranks  # (batch, k)
        logits = weights[:, :, None] * s[:, None, :] - spread[:, None, :]
        logits = torch.where(finite[:, None, :], logits, -torch.inf)
        shifted = (logits - logits.amax(-1, keepdim=True).detach()) * (scale[:, :, None] / self.tau)
        return torch.softmax(shifted, dim=-1).transpose(1, 2)

    def _finite_permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """The core on all-finite rows: the masked path's operations without the masks, which are
        identities here (the same values and gradients, bit for bit), in a third fewer calls."""
        scale = power_of_two_scale(scores)
        s = scores / scale
        spread = (s[:, :, None] - s[:, None, :]).abs().sum(-1)
        ranks = torch.arange(1, k + 1, device=scores.device, dtype=scores.dtype)
        weights = scores.shape[1] + 1 - 2 * ranks  # (k,)
        logits = weights[None, :, None] * s[:, None, :] - spread[:, None, :]
        shifted = (logits - logits.amax(-1, keepdim=True).detach()) * (scale[:, :, None] / self.tau)
        return torch.softmax(shifted, dim=-1).transpose(1, 2)
