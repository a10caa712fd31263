"""Logistic regression on the synthetic Gaussian data (STk paper §4.2): binary cross-entropy per
sample, an aggregate over the batch, an l1 term on the weights, Adam, batch 512, early stopping on
validation accuracy. Two implementations with identical numerics:

- :func:`fit_single`: one model, a plain ``torch.optim.Adam`` loop (the reference, and what the
  Table 2 "Time" row times);
- :class:`LogisticPopulation`: many independent models (own data, seed, k) trained in lockstep as
  stacked tensors; a member that stops leaves the active set (tests check it against ``fit_single``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from topklab.losses import ATk, Average, MATk, Maximum, STk
from topklab.losses.k import resolve_k, validate_k
from topklab.population.aggregates import BATCHED_AGGREGATES, thresholded
from topklab.synthetic.gaussian import SyntheticSplit
from topklab.utils.batching import batches_per_epoch
from topklab.utils.errors import TopklabError


@dataclass(frozen=True)
class Column:
    """A Table 2 column: an aggregate, and for STk the ReLU variant φ."""

    aggregate: str          # average | maximum | atk | matk | stk
    smoothing: str = "srelu"

    @property
    def uses_k(self) -> bool:
        return self.aggregate in ("atk", "matk", "stk")

    @property
    def uses_lambda(self) -> bool:
        return self.aggregate in ("matk", "stk")

    def batched(self):
        if self.aggregate == "stk":
            return thresholded(self.smoothing)
        return BATCHED_AGGREGATES[self.aggregate]

    def module(self, k, delta: float, lam_init: float, scale: str) -> nn.Module:
        return MODULES[self.aggregate](k, delta, self.smoothing, lam_init, scale)


MODULES = {
    "average": lambda k, delta, smoothing, lam_init, scale: Average(),
    "maximum": lambda k, delta, smoothing, lam_init, scale: Maximum(),
    "atk": lambda k, delta, smoothing, lam_init, scale: ATk(k),
    "matk": lambda k, delta, smoothing, lam_init, scale: MATk(k, lam_init=lam_init, scale=scale),
    "stk": lambda k, delta, smoothing, lam_init, scale: STk(k, delta=delta, smoothing=smoothing,
                                                            lam_init=lam_init, scale=scale),
}


@dataclass
class SyntheticTrainer:
    """Settings shared by both implementations.

    Parameters
    ----------
    batch_size : int >= 1 (paper: 512)
    lr : float > 0, Adam step size (paper: "default", 1e-3); betas/eps are PyTorch's defaults
    l1 : float >= 0, coefficient of ``l1·‖w‖₁`` (paper: not given; our choice, a config field)
    delta : float > 0, SReLU δ (paper: 0.01)
    lam_init : float or "auto", initial λ of MATk/STk. ``auto`` starts λ at its optimum for the
        initial model: the ⌈n·k/B⌉-th largest per-sample training loss at initialisation (see
        :func:`initial_threshold`). The paper does not say how λ starts.
    eval_every : int >= 1, steps between validation evaluations
    patience, min_delta : stop once validation accuracy (a fraction) has not risen by more than
        ``min_delta`` for ``patience`` steps (paper: 1e-4 within 200 steps); roll back to the best
    max_epochs : int >= 1, cap for members that never stop
    """

    batch_size: int = 512
    lr: float = 1e-3
    l1: float = 1e-3
    delta: float = 0.01
    lam_init: float | str = 0.0
    eval_every: int = 10
    patience: int = 200
    min_delta: float = 1e-4
    max_epochs: int = 200
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        for name in ("batch_size", "eval_every", "patience", "max_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TopklabError(f"synthetic trainer {name}={value!r} must be an int >= 1")
        if self.lam_init != "auto" and not isinstance(self.lam_init, (int, float)):
            raise TopklabError(f"synthetic trainer lam_init={self.lam_init!r} must be a number or 'auto'")
        if not self.lr > 0 or not self.delta > 0 or self.l1 < 0 or self.min_delta < 0:
            raise TopklabError(f"synthetic trainer needs lr > 0, delta > 0, l1 >= 0, min_delta >= 0; got "
                               f"lr={self.lr}, delta={self.delta}, l1={self.l1}, min_delta={self.min_delta}")


def initial_threshold(losses: torch.Tensor, k_count: torch.Tensor, batch: int) -> torch.Tensor:
    """The ``round(n·k/B)``-th largest (at least the first) of ``losses`` (..., n) for each k count
    ``k_count`` (...,): where λ* = ℓ_[k] would sit if the whole training set were one batch."""
    n = losses.shape[-1]
    rank = (n * k_count / batch).round().clamp(1, n).long()
    ranked = torch.sort(losses, dim=-1, descending=True).values
    return ranked.gather(-1, (rank - 1)[..., None])[..., 0]


def init_linear(seed: int, d: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(d, 1)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Fraction of rows where ``logit > 0`` matches ``y`` ∈ {0, 1}, along the last axis."""
    return ((logits > 0).to(y.dtype) == y).double().mean(-1)


def epoch_order(generator: torch.Generator, n: int) -> torch.Tensor:
    return torch.randperm(n, generator=generator)


def fit_single(column: Column, k, train: SyntheticSplit, val: SyntheticSplit, seed: int,
               settings: SyntheticTrainer, scale: str = "paper") -> dict:
    """Train one logistic regression; returns ``w`` (d,), ``b``, ``lam``, ``best_step``, ``steps``,
    ``val_acc`` (best), ``seconds``."""
    start = time.perf_counter()
    n, d = train.x.shape
    with torch.random.fork_rng():
        model = init_linear(seed, d)
    lam_init = settings.lam_init
    if lam_init == "auto":
        with torch.no_grad():
            losses = F.binary_cross_entropy_with_logits(model(train.x)[:, 0], train.y, reduction="none")
        batch = min(settings.batch_size, n)
        k_count = resolve_k(k, batch) if column.uses_k else 1
        lam_init = float(initial_threshold(losses, torch.tensor(float(k_count)), batch))
    aggregate = column.module(k if column.uses_k else 1, settings.delta, lam_init, scale)
    params = list(model.parameters()) + list(aggregate.parameters())
    optimizer = torch.optim.Adam(params, lr=settings.lr, betas=settings.betas, eps=settings.eps)
    generator = torch.Generator().manual_seed(seed)
    per_epoch = batches_per_epoch(n, settings.batch_size, drop_last=True)

    def snapshot():
        return [p.detach().clone() for p in params]

    with torch.no_grad():
        best_acc = float(accuracy(model(val.x)[:, 0], val.y))
    best, best_step, step = snapshot(), 0, 0
    stopped = False
    for _epoch in range(settings.max_epochs):
        order = epoch_order(generator, n)
        for b in range(per_epoch):
            rows = order[b * settings.batch_size:(b + 1) * settings.batch_size]
            losses = F.binary_cross_entropy_with_logits(model(train.x[rows])[:, 0], train.y[rows], reduction="none")
            objective = aggregate(losses) + settings.l1 * model.weight.abs().sum()
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            optimizer.step()
            step += 1
            if step % settings.eval_every == 0:
                with torch.no_grad():
                    acc = float(accuracy(model(val.x)[:, 0], val.y))
                if acc > best_acc + settings.min_delta:
                    best_acc, best, best_step = acc, snapshot(), step
                if step - best_step >= settings.patience:
                    stopped = True
                    break
        if stopped:
            break
    w, b = best[0][0], best[1][0]
    lam = best[2] if column.uses_lambda else torch.tensor(float("nan"))
    return {"w": w, "b": b, "lam": lam, "best_step": best_step, "steps": step, "val_acc": best_acc,
            "seconds": time.perf_counter() - start}


class LogisticPopulation:
    """R × M independent logistic regressions in lockstep: member (r, m) trains on ``train[r]``
    with seed ``seeds[r]`` and ``k[m]``, exactly as :func:`fit_single` would (same initialisation,
    batch order, Adam arithmetic, early stopping and roll-back).

    The M members of a repeat share its mini-batches (same seed, hence same order), so one batch
    of (R, B, d) rows serves all R·M models. A member that stops is frozen at its best state; the
    population runs until every member has stopped (or ``max_epochs``).
    """

    def __init__(self, column: Column, settings: SyntheticTrainer, scale: str = "paper"):
        if scale not in ("paper", "atk"):
            raise TopklabError(f"unknown scale {scale!r}; choose paper or atk")
        self.column = column
        self.settings = settings
        self.scale = scale

    def fit(self, train: list[SyntheticSplit], val: list[SyntheticSplit], seeds: list[int],
            k: list) -> dict[str, torch.Tensor]:
        """Returns (R, M) tensors ``b``, ``lam``, ``best_step``, ``steps``, ``val_acc`` and ``w`` (R, M, d)."""
        s = self.settings
        if not len(train) == len(val) == len(seeds):
            raise ValueError("train, val and seeds need one entry per repeat")
        for value in k:
            validate_k(value)
        xtr = torch.stack([t.x for t in train])
        ytr = torch.stack([t.y for t in train])
        xva = torch.stack([v.x for v in val])
        yva = torch.stack([v.y for v in val])
        R, n, d = xtr.shape
        M = len(k)
        per_epoch = batches_per_epoch(n, s.batch_size, drop_last=True)
        batch = min(s.batch_size, n)
        k_count = torch.as_tensor([resolve_k(v, batch) if self.column.uses_k else 1 for v in k],
                                  dtype=torch.float32).repeat(R)
        delta = torch.full((R * M,), s.delta)
        factor = batch / k_count if (self.scale == "atk" and self.column.uses_lambda) else torch.ones(R * M)
        aggregate = self.column.batched()

        generators = [torch.Generator().manual_seed(int(v)) for v in seeds]
        with torch.random.fork_rng():
            layers = [init_linear(int(v), d) for v in seeds]
        cur = {"w": torch.stack([m.weight.detach()[0] for m in layers])[:, None, :].repeat(1, M, 1),
               "b": torch.stack([m.bias.detach()[0] for m in layers])[:, None].repeat(1, M),
               "lam": torch.full((R, M), 0.0 if s.lam_init == "auto" else float(s.lam_init))}
        if s.lam_init == "auto":
            with torch.no_grad():
                logits = torch.einsum("rnd,rmd->rmn", xtr, cur["w"]) + cur["b"][..., None]
                losses = F.binary_cross_entropy_with_logits(logits, ytr[:, None, :].expand_as(logits), reduction="none")
                cur["lam"] = initial_threshold(losses, k_count.view(R, M), batch)
        trained = ["w", "b"] + (["lam"] if self.column.uses_lambda else [])
        m1 = {name: torch.zeros_like(cur[name]) for name in trained}
        m2 = {name: torch.zeros_like(cur[name]) for name in trained}

        def val_acc(state):
            return accuracy(torch.einsum("rnd,rmd->rmn", xva, state["w"]) + state["b"][..., None], yva[:, None, :])

        best = {name: t.clone() for name, t in cur.items()}
        best_acc = val_acc(cur)
        best_step = torch.zeros(R, M, dtype=torch.long)
        steps = torch.zeros(R, M, dtype=torch.long)
        running = torch.ones(R, M, dtype=torch.bool)
        step = 0
        beta1, beta2 = s.betas
        for _epoch in range(s.max_epochs):
            orders = torch.stack([epoch_order(g, n) for g in generators])
            for b in range(per_epoch):
                pos = orders[:, b * s.batch_size:(b + 1) * s.batch_size]
                rows = torch.arange(R)[:, None]
                xb, yb = xtr[rows, pos], ytr[rows, pos]                       # (R, B, d), (R, B)
                leaves = {name: cur[name].detach().requires_grad_(name in trained) for name in cur}
                logits = torch.einsum("rbd,rmd->rmb", xb, leaves["w"]) + leaves["b"][..., None]
                losses = F.binary_cross_entropy_with_logits(logits, yb[:, None, :].expand_as(logits), reduction="none")
                objective = factor * aggregate(losses.reshape(R * M, -1), k_count, leaves["lam"].reshape(-1), delta)
                objective = objective.sum() + s.l1 * leaves["w"].abs().sum()
                grads = torch.autograd.grad(objective, [leaves[name] for name in trained])
                step += 1
                correction1 = 1 - beta1 ** step
                correction2 = 1 - beta2 ** step
                with torch.no_grad():
                    for name, g in zip(trained, grads):
                        m1[name].lerp_(g, 1 - beta1)
                        m2[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                        denom = (m2[name].sqrt() / correction2 ** 0.5).add_(s.eps)
                        cur[name] = leaves[name].detach().addcdiv(m1[name], denom, value=-s.lr / correction1)
                steps[running] = step
                if step % s.eval_every == 0:
                    acc = val_acc(cur)
                    improved = running & (acc > best_acc + s.min_delta)
                    best_acc[improved] = acc[improved]
                    best_step[improved] = step
                    for name in best:
                        best[name][improved] = cur[name][improved]
                    running &= (step - best_step) < s.patience
                    if not running.any():
                        break
            if not running.any():
                break
        lam = best["lam"] if self.column.uses_lambda else torch.full((R, M), float("nan"))
        return {"w": best["w"], "b": best["b"], "lam": lam, "best_step": best_step, "steps": steps,
                "val_acc": best_acc}
