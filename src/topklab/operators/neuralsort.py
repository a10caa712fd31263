"""NeuralSort (Grover, Wang, Zweig & Ermon, ICLR 2019) as a top-k operator."""
from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, check_scores, positive


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

    Examples
    --------
    >>> NeuralSort(tau=0.01).permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
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

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "NeuralSort")
        n = scores.shape[1]
        spread = (scores[:, :, None] - scores[:, None, :]).abs().sum(-1)              # A_s·1, (batch, n)
        ranks = torch.arange(1, k + 1, device=scores.device, dtype=scores.dtype)
        logits = (n + 1 - 2 * ranks)[None, :, None] * scores[:, None, :] - spread[:, None, :]
        return torch.softmax(logits / self.tau, dim=-1).transpose(1, 2)
