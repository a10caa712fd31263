"""The training objective as one module: aggregate ∘ individual, plus the weight penalty.

:class:`Objective` owns the aggregate's trainable threshold λ (MATk/STk), and
:class:`TrainingModule` holds the model and the objective together. That one module is what the
optimizer's parameter groups, the checkpoint and a DistributedDataParallel wrapper see, so λ is
saved, restored and all-reduced with the model's weights.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from topklab.engine.distributed import all_gather_losses


class Objective(nn.Module):
    """``L = aggregate(individual(output, target)) + 1/(2C)·Σ‖θ‖² + l1·Σ|W| + model.auxiliary_loss()``.

    The last term is the model's own training terms of its last forward, when it has any (e.g. the
    STk threshold routers of :class:`~topklab.models.TransformerLM`).

    Parameters
    ----------
    individual : per-sample loss module (no reduction), e.g. :class:`topklab.losses.Logistic`
    aggregate : aggregate loss module on the 1-D per-sample losses, e.g. :class:`topklab.losses.STk`
    l2_C : float > 0 or None, C of the STk paper's regulariser 1/(2C)·‖θ‖² over every model
        parameter (larger C is weaker); None disables it
    l1 : float >= 0, coefficient of the l1 norm of the model's weight matrices (biases excluded)
    gather_losses : bool, under DDP aggregate the per-sample losses of every rank (the exact
        global top-k of ATk); see :mod:`topklab.engine.distributed`

    Examples
    --------
    >>> from topklab.losses import Average, Square
    >>> objective = Objective(Square(), Average(), l2_C=0.5)
    >>> model = nn.Linear(1, 1, bias=False)
    >>> _ = model.weight.data.fill_(2.0)
    >>> float(objective(model(torch.ones(2, 1)), torch.zeros(2), model).detach())  # 4 + 4 / (2·0.5)
    8.0
    """

    def __init__(
        self,
        individual: nn.Module,
        aggregate: nn.Module,
        l2_C: float | None = None,
        l1: float = 0.0,
        gather_losses: bool = False,
    ):
        super().__init__()
        if l2_C is not None and not l2_C > 0:
            raise ValueError(f"objective.l2_C={l2_C} must be > 0 (or null for no regulariser)")
        if not l1 >= 0:
            raise ValueError(f"objective.l1={l1} must be >= 0")
        self.individual = individual
        self.aggregate = aggregate
        self.l2_C = l2_C
        self.l1 = float(l1)
        self.gather_losses = gather_losses
        self.last_count = None  # losses the aggregate saw at the last call (tokens, in translation)

    def losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The 1-D per-sample losses the aggregate sees (every rank's under ``gather_losses``)."""
        losses = self.individual(output, target).reshape(-1)
        self.last_count = losses.numel()
        if self.gather_losses:
            losses = all_gather_losses(losses)
        return losses

    def penalty(self, model: nn.Module) -> torch.Tensor | float:
        total = 0.0
        if self.l2_C is not None:
            total = total + sum(p.square().sum() for p in model.parameters()) / (2.0 * self.l2_C)
        if self.l1:
            total = total + self.l1 * sum(p.abs().sum() for p in model.parameters() if p.dim() > 1)
        return total

    def forward(self, output: torch.Tensor, target: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        value = self.aggregate(self.losses(output, target))
        if model is None:
            return value
        auxiliary = model.auxiliary_loss() if hasattr(model, "auxiliary_loss") else 0.0
        return value + self.penalty(model) + auxiliary

    @property
    def threshold(self) -> float | None:
        """λ of a thresholded aggregate (MATk/STk) as a float, else None."""
        threshold = getattr(self.aggregate, "threshold", None)
        return None if threshold is None else float(threshold.detach())


def model_parameter_groups(model: nn.Module) -> list[dict]:
    """The model's own parameter groups when it states them (``model.parameter_groups()``, e.g.
    a frozen backbone with adapters and a head), else one group of its trainable parameters."""
    if hasattr(model, "parameter_groups"):
        return model.parameter_groups()
    return [{"params": [p for p in model.parameters() if p.requires_grad]}]


class TrainingModule(nn.Module):
    """Model and objective in one module: ``forward(x, y)`` returns ``(objective, output)``.

    The model runs under ``autocast()`` when a context factory is given; the objective always runs
    in float32. ``clock`` (optional) is called when the objective starts, and its value kept in
    ``loss_start``, so the engine can report the loss's share of a step.
    """

    def __init__(self, model: nn.Module, objective: Objective):
        super().__init__()
        self.model = model
        self.objective = objective
        self.loss_start = None

    def forward(self, x: torch.Tensor, y: torch.Tensor, autocast=None, clock=None):
        with autocast() if autocast is not None else contextlib.nullcontext():
            output = self.model(x)
        self.loss_start = clock() if clock is not None else None
        return self.objective(output.float(), y, self.model), output

    def parameter_groups(self) -> list[dict]:
        """The model's groups, plus the objective's own parameters without weight decay: λ's group as
        the aggregate states it (its own ``lr`` with ``constant_lr`` under ``lam_lr``; none when λ is
        solved), and any other trainable parameter of the objective."""
        groups = model_parameter_groups(self.model)
        aggregate = self.objective.aggregate
        own = aggregate.parameter_groups() if hasattr(aggregate, "parameter_groups") else []
        listed = {id(p) for group in own for p in group["params"]}
        rest = [p for p in self.objective.parameters() if p.requires_grad and id(p) not in listed]
        return groups + own + ([{"params": rest, "weight_decay": 0.0}] if rest else [])
