"""AdaGrad and Adam as batched functional steps for the population executor: every tensor's first
dimension is the member (row), and each member has its own learning rate.

Each step is ``torch.optim``'s single-tensor arithmetic, operation for operation, so a member's
trajectory matches a ``torch.optim`` run of the same model bit for bit where the gradients match
(``tests/engine/test_population.py`` checks both against ``torch.optim``).
"""

from __future__ import annotations

import torch


def _rows(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor | float:
    """A per-row ``value`` (R,) shaped to broadcast over ``like`` (R, ...); a float as it is."""
    if isinstance(value, float):
        return value
    return value.reshape(value.shape + (1,) * (like.dim() - value.dim()))


class FunctionalOptimizer:
    """State: ``{name: tuple of tensors shaped like the parameter}``, rows = members."""

    def init(self, params: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, ...]]:
        raise NotImplementedError

    def step(
        self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], state: dict, lr: torch.Tensor, step: int
    ) -> dict[str, torch.Tensor]:
        """The parameters after one step (new tensors; ``state`` is updated in place).

        Parameters
        ----------
        params, grads : {name: Tensor (R, ...)}
        state : from :meth:`init`, rows aligned with ``params``
        lr : float (all rows), or Tensor (R,) float64 of each row's learning rate as given (each
            optimizer rounds it where torch rounds its Python float)
        step : int >= 1, the number of this step (all rows started together)
        """
        raise NotImplementedError

    @staticmethod
    def select(state: dict, rows: torch.Tensor) -> dict:
        """The state of the rows ``rows`` (an index or a mask), for a population that drops rows."""
        return {name: tuple(t[rows] for t in tensors) for name, tensors in state.items()}


class Adagrad(FunctionalOptimizer):
    """``torch.optim.Adagrad`` (no lr decay, weight decay or initial accumulator):
    ``s += g²``, ``θ −= η·g / (√s + ε)``.

    Parameters
    ----------
    eps : float > 0, torch's default 1e-10

    Examples
    --------
    >>> opt, p = Adagrad(), {"w": torch.tensor([[1.0, 2.0], [1.0, 2.0]])}
    >>> state = opt.init(p)
    >>> opt.step(p, {"w": torch.ones(2, 2)}, state, lr=torch.tensor([0.1, 0.5], dtype=torch.float64), step=1)["w"]
    tensor([[0.9000, 1.9000],
            [0.5000, 1.5000]])
    """

    def __init__(self, eps: float = 1e-10):
        if not eps > 0:
            raise ValueError(f"adagrad eps={eps!r} must be > 0")
        self.eps = eps

    def init(self, params):
        return {name: (torch.zeros_like(p),) for name, p in params.items()}

    def step(self, params, grads, state, lr, step):
        # torch: the Python float η, rounded by the kernel; per row: the same, rounded here
        rate = lr if isinstance(lr, float) else lr.to(next(iter(grads.values())).dtype)
        out = {}
        for name, g in grads.items():
            (total,) = state[name]
            total.addcmul_(g, g)
            out[name] = params[name] - _rows(rate, g) * g / (total.sqrt() + self.eps)
        return out


class Adam(FunctionalOptimizer):
    """``torch.optim.Adam`` (no weight decay, no amsgrad): ``m ← β1·m + (1−β1)·g``,
    ``v ← β2·v + (1−β2)·g²``, ``θ −= η/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) + ε)``.

    Parameters
    ----------
    betas : two floats in [0, 1), torch's default (0.9, 0.999)
    eps : float > 0, torch's default 1e-8

    Examples
    --------
    >>> opt, p = Adam(), {"w": torch.zeros(2, 1)}
    >>> state = opt.init(p)
    >>> lr = torch.tensor([0.1, 0.01], dtype=torch.float64)
    >>> opt.step(p, {"w": torch.tensor([[3.0], [-0.5]])}, state, lr=lr, step=1)["w"]
    tensor([[-0.1000],
            [ 0.0100]])
    """

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        betas = tuple(betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas) or not eps > 0:
            raise ValueError(f"adam needs two betas in [0, 1) and eps > 0, got betas={betas!r}, eps={eps!r}")
        self.betas, self.eps = betas, eps

    def init(self, params):
        return {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in params.items()}

    def step(self, params, grads, state, lr, step):
        beta1, beta2 = self.betas
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        # torch: the Python float −η/(1−β1ᵗ), rounded by the kernel; per row: the same, rounded here
        step_size = (
            -lr / correction1
            if isinstance(lr, float)
            else (-lr.double() / correction1).to(next(iter(grads.values())).dtype)
        )
        out = {}
        for name, g in grads.items():
            m1, m2 = state[name]
            m1.lerp_(g, 1 - beta1)
            m2.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (m2.sqrt() / correction2**0.5).add_(self.eps)
            if isinstance(step_size, float):
                out[name] = torch.addcdiv(params[name], m1, denom, value=step_size)
            else:
                out[name] = torch.addcdiv(params[name], _rows(step_size, g) * m1, denom)
        return out
