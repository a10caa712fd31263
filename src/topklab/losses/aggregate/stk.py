"""STk (STk paper Eq. 6): MATk with the ReLU smoothed, sort-free and O(n)."""

from __future__ import annotations

import torch

from topklab.losses.aggregate.lambda_rules import LambdaRule
from topklab.losses.aggregate.thresholded import ThresholdedTopK


class STk(ThresholdedTopK):
    """Smoothed top-k loss, STk paper Eq. 6 (Xia, Liu & Mao, NeurIPS 2024):

    ``L_st-k(λ) = (1/n)·Σ SReLU_δ(ℓ_i − λ) + (k/n)·λ``,  SReLU (Eq. 2) = ½(x + √(x²+δ²) − δ)

    Sort-free and O(n). ``L_mat-k − δ/2 <= L_st-k <= L_mat-k`` for every λ, and L_st-k → L_mat-k
    as δ → 0. The default scale is the paper's k/n, **not** ATk's 1/k. At its optimum over λ,
    ``Σ SReLU'(ℓ_i − λ) = k``: the rules of :mod:`~topklab.losses.aggregate.lambda_rules` keep λ
    at or near that root.

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1); a tensor, one k per row
        (as in :class:`MATk`).
    delta : float in [1e-15, 1e12]
        SReLU smoothing width; smaller is closer to MATk. Paper default 0.01. Ignored by the
        other smoothings.
    smoothing : {"srelu", "elu", "softplus", "leaky_relu"}
        φ in place of ReLU; the others are the Table 2 ablation at PyTorch defaults (they need
        ``lam_update="gradient"``).
    lam_update : {"adaptive", "track", "solve", "gradient"} or LambdaRule
        How λ follows the losses. None (default): "adaptive", the batch's root solved on batches below
        2,048 losses (up to 8 steps) and one step per call from the last call's λ from there on
        (one pass over the losses, about ``losses.mean()``); "solve", ``solve_steps`` steps to each
        batch's root; "track", one step per call; "gradient", the paper's SGD-STk.
    solve_steps : int >= 1
        Safeguarded steps per solved call (Newton's, or a power-law step outside a pile of losses;
        no early exit, so no synchronisation). Default 2.
    lam_lr, lam_init, lam_momentum, lam_constraint, scale, kernel, compile_min_n, dim, rows
        As in :class:`MATk`.

    Examples
    --------
    >>> loss = STk(k=0.5, delta=0.01, solve_steps=20)
    >>> losses = torch.tensor([1.0, 5.0, 3.0, 0.0], requires_grad=True)
    >>> value = loss(losses)  # a training call: every λ between ℓ_[3] = 1 and ℓ_[2] = 3 (δ/2 in) is a root
    >>> round(value.item(), 4), 1 < loss.threshold.item() < 3  # MATk's minimum is 2; STk's lies within δ/2 below
    (1.995, True)
    >>> loss.eval()(losses.detach()).item() == value.item()  # outside training: the running average of the roots
    True
    >>> per_member = loss.batched(torch.tensor([[1.0, 5.0, 3.0, 0.0]] * 2), torch.tensor([2.0, 2.0]),
    ...                           torch.tensor([3.0, 3.0]), delta=torch.tensor([0.01, 1.0]))
    >>> [round(v, 4) for v in per_member.tolist()]  # a wider δ lies further below MATk
    [1.9963, 1.7043]
    """

    hyperparameters = ("k", "delta")

    def __init__(
        self,
        k: int | float | torch.Tensor,
        delta: float = 0.01,
        smoothing: str = "srelu",
        lam_update: str | LambdaRule | None = None,
        **options,
    ):
        super().__init__(k, smoothing=smoothing, delta=delta, lam_update=lam_update, **options)
