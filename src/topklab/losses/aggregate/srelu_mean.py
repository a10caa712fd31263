"""``mean_i SReLU_δ(ℓ_i − λ)`` per row as one autograd node, the O(n) core of STk (paper Eqs. 2 and 6).

Written with the autograd graph of the elementwise formula, it stores several n-sized temporaries
and runs about a dozen passes over memory. Here the forward keeps no temporaries (it saves only its
inputs) and the backward recomputes ``SReLU'(x) = ½(1 + x/√(x²+δ²))`` with the same rounding as
autograd of the elementwise formula (so the module and any elementwise reference agree to the bit):
a few passes and a few (P, n)-sized buffers. ``tests/test_losses_aggregate.py`` gradchecks it.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _SReLUMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, losses: torch.Tensor, lam: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(losses, lam, delta)
        x = losses - lam[:, None]
        total = x.sum(1) + torch.hypot(x, delta[:, None]).sum(1)
        return 0.5 * (total / losses.shape[1] - delta)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        losses, lam, delta = ctx.saved_tensors
        x = losses - lam[:, None]
        # SReLU'(x)·g/n = u + 2·v·x with u = ½·g/n and v = u / (2·√(x²+δ²)), summed in the order
        # autograd sums the elementwise formula's graph, so both give the same bits.
        half = (grad_out[:, None].expand_as(x) / losses.shape[1]) * 0.5
        root = torch.sqrt(x * x + delta[:, None] * delta[:, None])
        vx = (half / (2 * root)).mul_(x)
        grad_losses = half.add_(vx).add_(vx)
        grad_lam = -grad_losses.sum(1) if ctx.needs_input_grad[1] else None
        return grad_losses if ctx.needs_input_grad[0] else None, grad_lam, None


def srelu_mean(losses: torch.Tensor, lam: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``(1/n)·Σ_i SReLU_δp(ℓ_pi − λ_p)`` for each row p of ``losses``, differentiable in the
    losses and λ (δ is a constant).

    Parameters
    ----------
    losses : Tensor (P, n), per-sample losses, one row per member
    lam : Tensor (P,), the threshold λ of each row
    delta : Tensor (P,), the SReLU width δ > 0 of each row

    Returns
    -------
    Tensor (P,)

    Examples
    --------
    >>> from topklab.losses.smoothing import srelu
    >>> l, lam, delta = torch.tensor([[1.0, 5.0, 3.0, 0.0]]), torch.tensor([3.0]), torch.tensor([0.01])
    >>> bool(torch.isclose(srelu_mean(l, lam, delta), srelu(l - 3.0, 0.01).mean()))
    True
    """
    return _SReLUMean.apply(losses, lam, delta)
