"""``mean_i SReLU_δ(ℓ_i − λ)`` as one autograd node, the O(n) core of STk (paper Eqs. 2 and 6).

Written with the autograd graph of the elementwise formula, it stores several n-sized temporaries
and runs about a dozen passes over memory. Here the forward keeps no temporaries (it saves only its
inputs) and the backward recomputes ``SReLU'(x) = ½(1 + x/√(x²+δ²))`` in place:
a few passes and one n-sized buffer each way. ``tests/test_losses_aggregate.py`` gradchecks it.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _SReLUMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, losses: torch.Tensor, lam: torch.Tensor, delta: float) -> torch.Tensor:
        ctx.save_for_backward(losses, lam)
        ctx.delta = delta
        x = losses - lam
        total = x.sum() + torch.hypot(x, x.new_tensor(delta)).sum()
        return 0.5 * (total / losses.numel() - delta)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        losses, lam = ctx.saved_tensors
        x = losses - lam
        slope = x.div_(torch.hypot(x, x.new_tensor(ctx.delta))).add_(1.0)   # 2·SReLU'(x)
        grad_losses = slope.mul_(grad_out / (2 * losses.numel()))
        grad_lam = -grad_losses.sum() if ctx.needs_input_grad[1] else None
        return grad_losses if ctx.needs_input_grad[0] else None, grad_lam, None


def srelu_mean(losses: torch.Tensor, lam: torch.Tensor, delta: float) -> torch.Tensor:
    """``(1/n)·Σ SReLU_δ(ℓ_i − λ)`` for 1-D ``losses`` and a scalar ``lam``, differentiable in both.

    Examples
    --------
    >>> from topklab.losses.smoothing import srelu
    >>> l, lam = torch.tensor([1.0, 5.0, 3.0, 0.0]), torch.tensor(3.0)
    >>> bool(torch.isclose(srelu_mean(l, lam, 0.01), srelu(l - lam, 0.01).mean()))
    True
    """
    return _SReLUMean.apply(losses, lam, float(delta))
