"""The aggregate-loss contract: one batch-native kernel per aggregate, which the 1-D module forward
and the population executor (:mod:`topklab.engine.population`) both call."""

from __future__ import annotations

import torch
from torch import nn

from topklab.losses.k import resolve_k


def check_losses(losses: torch.Tensor) -> torch.Tensor:
    """Return ``losses`` if it is a non-empty 1-D tensor of per-sample losses, else raise."""
    if not isinstance(losses, torch.Tensor) or losses.dim() != 1:
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(
            f"an aggregate loss takes a 1-D tensor of per-sample losses, got {shape}; "
            f"compute the individual loss with reduction='none' and flatten it"
        )
    if losses.numel() == 0:
        raise ValueError("cannot aggregate an empty batch of losses (n=0)")
    return losses


def mean_without_overflow(plain: torch.Tensor, values: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``plain`` (P,), a row mean of ``values`` (P, m) over ``count`` (P,) as an aggregate computes it;
    where it overflowed to ±inf while the mean is finite, the mean with each term divided by the count
    in float64 instead. Ordinary rows keep ``plain`` and its gradient bit for bit. On a CPU the float64
    pass runs only when a row overflowed; elsewhere it always runs (a check would synchronise).

    Examples
    --------
    >>> values = torch.tensor([[3e38, 3e38], [1.0, 2.0]])
    >>> mean_without_overflow(values.mean(1), values, torch.tensor([2.0, 2.0]))
    tensor([3.0000e+38, 1.5000e+00])
    """
    if plain.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(torch.isinf(plain).any()):
        return plain  # the usual case on a CPU, where the check costs no synchronisation
    wide = (values.to(torch.float64) / count.to(torch.float64)[:, None]).sum(1).to(values.dtype)
    return torch.where(torch.isinf(plain) & torch.isfinite(wide), wide, plain)


class Aggregate(nn.Module):
    """An aggregate loss: n per-sample losses -> one number (STk paper §3-4).

    Subclasses implement :meth:`batched` on a (P, n) block of P independent rows (members) and
    declare what a hyperparameter grid may vary:

    - ``hyperparameters``: the grid axes the aggregate uses, a subset of ``("k", "delta")``;
    - ``has_threshold``: whether it owns a trainable threshold λ (MATk, STk).

    ``forward(losses)`` on 1-D losses is ``batched`` on one row with the module's own k (resolved
    to a count for this batch), λ and δ, so a single model and a population run the same kernel.

    Examples
    --------
    >>> from topklab.losses import ATk
    >>> ATk.hyperparameters, ATk.has_threshold
    (('k',), False)
    >>> ATk(k=2).batched(torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 8.0]]), torch.tensor([2.0, 1.0]), None, None)
    tensor([4., 8.])
    """

    hyperparameters: tuple[str, ...] = ()
    has_threshold: bool = False
    k: int | float | None = None  # the module's own k (None: the aggregate has no k)
    delta: float | None = None  # the module's own δ (None: the aggregate has no δ)

    def batched(
        self, losses: torch.Tensor, k: torch.Tensor, lam: torch.Tensor | None, delta: torch.Tensor | None
    ) -> torch.Tensor:
        """The aggregate of each row of ``losses`` (P, n) -> (P,).

        Parameters
        ----------
        losses : Tensor (P, n), per-sample losses, one row per member
        k : Tensor (P,), per-row k as a count in [1, n] (resolve fractions with
            :func:`topklab.losses.k.resolve_k` first); ignored without ``"k"`` in ``hyperparameters``
        lam : Tensor (P,) or None, per-row effective threshold λ; used only when ``has_threshold``
        delta : Tensor (P,) or None, per-row smoothing width δ > 0; used only with ``"delta"``
        """
        raise NotImplementedError(f"{type(self).__name__} must implement batched(losses, k, lam, delta)")

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        losses = check_losses(losses)
        n = losses.numel()
        k = losses.new_tensor([n if self.k is None else resolve_k(self.k, n)])
        lam = self.threshold.to(losses.dtype)[None] if self.has_threshold else None
        delta = None if self.delta is None else losses.new_tensor([self.delta])
        return self.batched(losses[None], k, lam, delta).squeeze(0)
