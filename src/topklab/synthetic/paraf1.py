"""ParaF1 (Tian & Gu 2017): F1 of the recovered support of a weight vector."""

from __future__ import annotations

import torch


def support(w: torch.Tensor, tol: float) -> torch.Tensor:
    """Boolean mask of the entries with ``|w_j| > tol`` (the last dimension is the weight axis).

    Optimisers such as Adam never produce exact zeros under an l1 term, so a tolerance is needed;
    it is a config field (``support_tol``) because the paper does not give one.
    """
    if tol < 0:
        raise ValueError(f"support tolerance tol={tol} must be >= 0")
    return w.abs() > tol


def para_f1(w_hat: torch.Tensor, w_star: torch.Tensor, tol: float) -> torch.Tensor:
    """``2·P·R/(P+R)`` with precision ``|S(ŵ) ∩ S(w*)|/|S(ŵ)|`` and recall ``|S(ŵ) ∩ S(w*)|/|S(w*)|``.

    Parameters
    ----------
    w_hat : (..., d) learned weights (a batch of them is fine)
    w_star : (d,) true weights; its support is its non-zero entries
    tol : float >= 0, entries of ``w_hat`` with ``|w| <= tol`` count as zero

    Returns 0 where ŵ has an empty support or no overlap.

    Examples
    --------
    >>> para_f1(torch.tensor([1.0, 0.0, 0.5, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0]), tol=0.1)
    tensor(0.5000)
    """
    found = support(w_hat, tol)
    true = w_star != 0
    hits = (found & true).sum(-1).double()
    precision = hits / found.sum(-1).clamp(min=1)
    recall = hits / true.sum().clamp(min=1)
    f1 = torch.where(hits > 0, 2 * precision * recall / (precision + recall).clamp(min=1e-300), torch.zeros_like(hits))
    return f1.to(w_hat.dtype)
