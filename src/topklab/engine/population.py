"""The population executor: many independent small models, each with its own data split, seed and
hyperparameters, trained in lockstep as one batched tensor program (the STk paper's tabular grid,
Tables 3, 4, 6, and its synthetic experiments, Table 2 and Figures 3-4).

Member m reproduces one plain training run: the model built under ``torch.manual_seed(seed_m)``,
mini-batches from a ``torch.Generator`` seeded with ``seed_m`` (one ``randperm`` per epoch), the
objective ``aggregate(individual(f(x), y)) + 1/(2C_m)·Σθ² + l1_m·Σ|W|``, a ``torch.optim``
AdaGrad or Adam step, validation every ``eval_every`` steps, early stopping, and roll-back to the
best validation state (``tests/engine/test_population.py`` checks members against such a loop). The
aggregate is an :class:`~topklab.losses.aggregate.base.Aggregate` module run through its batched
kernel, the same kernel its 1-D forward uses.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import reduce
from types import SimpleNamespace
from typing import NamedTuple

import torch
from torch import nn

from topklab.engine.functional_optim import FunctionalOptimizer
from topklab.engine.population_layout import Gathered, Grouped
from topklab.engine.stacked import StackedModel
from topklab.engine.stopping import REPORT_STATES, EarlyStopping
from topklab.losses.aggregate.base import Aggregate, accumulation_dtype
from topklab.utils.batching import batches_per_epoch
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError
from topklab.utils.k import resolve_k, validate_k

__all__ = ["DataGroup", "Gathered", "Grouped", "Members", "Metric", "PopulationExecutor", "initial_threshold"]


@dataclass
class Members:
    """Per-member settings of a population: sequences of one entry per member, or one value for all.

    Parameters
    ----------
    split : ints in [0, number of data groups), the data group each member trains on
    seed : ints >= 0, each member's initialisation and batch-order seed; members with the same
        (split, seed) see the same mini-batches
    k : ints >= 1 (counts) or floats in (0, 1] (fractions of the batch); ignored by aggregates
        without k (pass 1)
    lr : floats > 0, the optimizer's step size
    l2_C : floats > 0 (``inf``: none), C of the regulariser 1/(2C)·Σθ² over all model parameters
    l1 : floats >= 0, coefficient of l1·Σ|W| over the weight matrices (not biases)
    delta : floats > 0, SReLU width δ (STk); ignored by the other aggregates
    lam_init : floats or "auto", the initial threshold λ (MATk/STk). ``auto`` starts λ at the
        ``round(n·k/B)``-th largest training loss of the initial model (see :func:`initial_threshold`)

    Examples
    --------
    >>> members = Members(split=[0, 0, 1], seed=[0, 1, 0], k=0.5, lr=[0.1, 0.01, 0.1])
    >>> len(members), members.k, members.l2_C[0]
    (3, [0.5, 0.5, 0.5], inf)
    """

    split: Sequence[int]
    seed: Sequence[int]
    k: Sequence[int | float] | int | float = 1
    lr: Sequence[float] | float = 0.1
    l2_C: Sequence[float] | float = math.inf
    l1: Sequence[float] | float = 0.0
    delta: Sequence[float] | float = 0.01
    lam_init: Sequence[float | str] | float | str = 0.0

    def __post_init__(self):
        size = len(self.split)
        if size == 0:
            raise TopklabError("members is empty; give at least one member (split, seed)")
        for field in fields(self):
            value = getattr(self, field.name)
            value = list(value) if isinstance(value, (list, tuple)) else [value] * size
            if len(value) != size:
                raise TopklabError(
                    f"members.{field.name} has {len(value)} entries for {size} members; give one "
                    f"per member or a single value"
                )
            setattr(self, field.name, value)
        for k in self.k:
            validate_k(k)
        checks = (
            ("split", lambda v: isinstance(v, numbers.Integral) and v >= 0, "an int >= 0"),
            ("seed", lambda v: isinstance(v, numbers.Integral) and v >= 0, "an int >= 0"),
            ("lr", lambda v: v > 0, "> 0"),
            ("l2_C", lambda v: v > 0, "> 0 (inf for none)"),
            ("l1", lambda v: v >= 0, ">= 0"),
            ("delta", lambda v: v > 0, "> 0"),
            ("lam_init", lambda v: v == "auto" or math.isfinite(v), "a number or 'auto'"),
        )
        for name, ok, rule in checks:
            bad = [v for v in getattr(self, name) if isinstance(v, bool) or not _safe(ok, v)]
            if bad:
                raise TopklabError(f"members.{name} contains {bad[0]!r}; every entry must be {rule}")

    def __len__(self) -> int:
        return len(self.split)


def _safe(check: Callable, value) -> bool:
    try:
        return bool(check(value))
    except TypeError:
        return False


class Metric(NamedTuple):
    """A validation/report metric: ``fn(outputs (P, n, 1), targets (P, n)) -> (P,)``."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    higher_is_better: bool


@dataclass
class DataGroup:
    """One data set of a population (members name it by index in ``Members.split``)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None


def initial_threshold(losses: torch.Tensor, k_count: torch.Tensor, batch: int) -> torch.Tensor:
    """The ``round(n·k/B)``-th largest (at least the first) of ``losses`` (..., n) for each k count
    ``k_count`` (...,): where λ* = ℓ_[k] would sit if the whole training set were one batch.

    Examples
    --------
    >>> initial_threshold(torch.tensor([[0.1, 0.9, 0.5, 0.7]]), torch.tensor([1.0]), batch=2)  # 2nd of 4
    tensor([0.7000])
    """
    n = losses.shape[-1]
    rank = (n * k_count / batch).round().clamp(1, n).long()
    ranked = torch.sort(losses, dim=-1, descending=True).values
    return ranked.gather(-1, (rank - 1)[..., None])[..., 0]


def _stack(groups: Sequence, part: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    xs = [getattr(g, f"x_{part}", None) for g in groups]
    ys = [getattr(g, f"y_{part}", None) for g in groups]
    if any(v is None for v in xs + ys):
        raise TopklabError(f"a data group has no {part} part (x_{part}, y_{part}); leave {part!r} out of report")
    if len({tuple(x.shape) for x in xs}) != 1:
        raise TopklabError(
            f"the data groups' {part} parts differ in shape ({sorted({tuple(x.shape) for x in xs})}); "
            f"a population needs equally sized groups"
        )
    return torch.stack(xs).to(dtype), torch.stack(ys).to(dtype)


class _Rows:
    """The executor's row-aligned state: member ids, parameters, optimizer state, per-row settings
    and whether each row still trains; :meth:`keep` drops rows (a retiring layout)."""

    def __init__(self, ids: torch.Tensor, params: dict, settings: dict):
        self.ids, self.params, self.settings = ids, params, settings
        self.state: dict = {}
        self.running = torch.ones(len(ids), dtype=torch.bool)

    def keep(self, mask: torch.Tensor, optimizer: FunctionalOptimizer) -> None:
        self.ids, self.running = self.ids[mask], self.running[mask]
        self.params = {name: t[mask] for name, t in self.params.items()}
        self.settings = {name: t[mask] for name, t in self.settings.items()}
        self.state = optimizer.select(self.state, mask)


class PopulationExecutor:
    """Trains a population of independent models in lockstep (see the module docstring).

    Parameters
    ----------
    aggregate : Aggregate module (e.g. ``build_aggregate("stk")``); its fixed settings (smoothing,
        scale, ATk method, λ constraint) apply to every member, k/δ/λ are per member
    individual : per-sample loss module, elementwise on (P, B, 1) outputs and (P, B) targets
    model : :class:`~topklab.engine.stacked.StackedModel` (``StackedMLP``, ``StackedLinear``)
    optimizer : :class:`~topklab.engine.functional_optim.FunctionalOptimizer` (``Adagrad()``, ``Adam()``)
    metric : :class:`Metric`, for validation (early stopping, roll-back) and the report
    max_epochs : int >= 1, cap for members that never stop
    batch_size : int >= 1
    eval_every : int >= 1, steps between validations
    patience : int >= 1 or None, stop once validation has not improved for this many steps
        (None: train all epochs)
    min_delta : float >= 0, a validation score must beat the best by more than this (ties keep the
        earlier state)
    drop_last : bool, drop an incomplete last batch (kept when it is the only one)
    layout : :class:`Gathered` (a member that stops retires) or :class:`Grouped` (members sharing
        (split, seed) share each batch without copies; a member that stops is frozen)
    eval_chunk : int >= 1, most members evaluated in one call (bounds memory)
    dtype : torch dtype of parameters and data

    Examples
    --------
    >>> from topklab.engine.functional_optim import Adagrad
    >>> from topklab.engine.stacked import StackedLinear
    >>> from topklab.losses import STk, Square
    >>> from topklab.tasks.metrics import rmse
    >>> x = torch.linspace(-1, 1, 64)[:, None]
    >>> group = DataGroup(x, 2 * x[:, 0], x[::2], 2 * x[::2, 0])
    >>> executor = PopulationExecutor(STk(0.5, lam_update="gradient"), Square(), StackedLinear(1), Adagrad(), Metric("rmse", rmse, False),
    ...                               max_epochs=50, batch_size=16, patience=None)
    >>> result = executor.fit([group], Members(split=[0, 0], seed=[0, 1], k=[0.5, 1.0], lr=0.5), report=("val",))
    >>> sorted(result), result["val_rmse"].shape, bool((result["val_rmse"] < 0.1).all())
    (['best_step', 'diverged', 'hard_share', 'lam_minus_kth', 'lambda', 'params', 'steps', 'val_rmse'], torch.Size([2]), True)
    """

    def __init__(
        self,
        aggregate: Aggregate,
        individual: nn.Module,
        model: StackedModel,
        optimizer: FunctionalOptimizer,
        metric: Metric,
        max_epochs: int = 200,
        batch_size: int = 16,
        eval_every: int = 1,
        patience: int | None = 50,
        min_delta: float = 1e-6,
        drop_last: bool = True,
        layout: type = Gathered,
        eval_chunk: int = 4096,
        dtype: torch.dtype = torch.float32,
        report_state: str = "best",
    ):
        if not isinstance(aggregate, Aggregate):
            raise TopklabError(
                f"aggregate={aggregate!r} is not an Aggregate module; build one with "
                f"topklab.engine.aggregates.build_aggregate(name)"
            )
        if getattr(aggregate, "lam_lr", None) is not None:
            raise TopklabError(
                f"the population executor trains λ at each member's lr; build the aggregate with "
                f"lam_lr=None, not {aggregate!r}"
            )
        for name, value in (
            ("max_epochs", max_epochs),
            ("batch_size", batch_size),
            ("eval_every", eval_every),
            ("eval_chunk", eval_chunk),
            ("patience", 1 if patience is None else patience),
        ):
            check_int(f"population {name}", value, error=TopklabError)
        if not min_delta >= 0:
            raise TopklabError(f"population min_delta={min_delta!r} must be >= 0")
        if report_state not in REPORT_STATES:
            raise TopklabError(f"population report_state={report_state!r}; choose one of {', '.join(REPORT_STATES)}")
        if layout not in (Gathered, Grouped):
            raise TopklabError(f"population layout={layout!r}; choose Gathered or Grouped")
        self.aggregate, self.individual, self.model, self.optimizer = aggregate, individual, model, optimizer
        self.metric = metric
        self.max_epochs, self.batch_size, self.eval_every = max_epochs, batch_size, eval_every
        self.patience, self.min_delta, self.drop_last = patience, min_delta, drop_last
        self.layout, self.eval_chunk, self.dtype = layout, eval_chunk, dtype
        self.report_state = report_state

    def fit(
        self,
        groups: Sequence,
        members: Members,
        report: Sequence[str] = ("train", "val", "test"),
        on_stop: Callable[[int], None] | None = None,
    ) -> dict:
        """Train every member; returns per-member results in member order:

        ``best_step``, ``steps`` (long), ``diverged`` (bool: the objective became non-finite; such a
        member stops and keeps its best state), ``lambda`` (the best state's λ; the initial value for
        aggregates without one), ``params`` (the best state, ``{name: (P, ...)}``), and
        ``<part>_<metric>`` (float64) of the best state for each part in ``report``; for an aggregate
        with a threshold also ``hard_share`` and ``lam_minus_kth`` (:meth:`_threshold_diagnostics`). With
        ``report_state="last"`` these are of the state each member stopped in instead (a diverged
        member keeps its best state); ``best_step`` still names the best validation step.
        ``groups`` are objects with ``x_train, y_train, x_val, y_val`` (and the reported parts),
        e.g. :class:`DataGroup` or tabular splits. ``on_stop(n)`` is called whenever n members stop.
        """
        run = self._prepare(groups, members)
        self._start(run, members)
        for _epoch in range(self.max_epochs):
            if not run.rows.running.any():
                break
            orders = torch.stack([torch.randperm(run.n_train, generator=g) for g in run.generators])
            for b in range(run.per_epoch):
                positions = orders[:, b * self.batch_size : (b + 1) * self.batch_size]
                if self._train_batch(run, positions, members, on_stop):
                    break
        rows, best = run.rows, run.best
        run.steps[rows.ids[rows.running]] = run.step
        if self.report_state == "last":
            for name in best:
                best[name][rows.ids[rows.running]] = rows.params[name][rows.running]
        if on_stop is not None and rows.running.any():
            on_stop(int(rows.running.sum()))
        result = self._result(run.layout, best, run.tracker, run.steps, run.diverged, groups, report)
        if self.aggregate.has_threshold:
            result.update(self._threshold_diagnostics(run.layout, best, result["lambda"], members.k, groups))
        return result

    def _prepare(self, groups: Sequence, members: Members) -> SimpleNamespace:
        """The run's data, layout, batch generators and per-row settings (before any parameter)."""
        split, seed = torch.as_tensor(members.split), torch.as_tensor(members.seed)
        if int(split.max()) >= len(groups):
            raise TopklabError(f"members.split names group {int(split.max())} but {len(groups)} data groups were given")
        pairs, pair = torch.unique(torch.stack([split, seed]), dim=1, return_inverse=True)
        layout = self.layout(self.model, split, pair, self.eval_chunk)
        xtr, ytr = _stack(groups, "train", self.dtype)
        xva, yva = _stack(groups, "val", self.dtype)
        generators = [torch.Generator().manual_seed(int(s)) for s in pairs[1]]
        n_train = xtr.shape[1]
        per_epoch = batches_per_epoch(n_train, self.batch_size, self.drop_last)
        # batch sizes of an epoch; the first, min(batch_size, n), is also auto-λ's B
        sizes = {min(self.batch_size, n_train - b * self.batch_size) for b in range(per_epoch)}
        settings = {
            "lr": torch.tensor(members.lr, dtype=torch.float64),
            "inv_2c": 1.0 / (2.0 * torch.as_tensor(members.l2_C, dtype=self.dtype)),
            "l1": torch.as_tensor(members.l1, dtype=self.dtype),
            "delta": torch.as_tensor(members.delta, dtype=self.dtype),
            **{
                ("k", size): torch.as_tensor(
                    [resolve_k(k, size) for k in members.k], dtype=accumulation_dtype(self.dtype)
                )  # counts are exact in float32, not in half precision
                for size in sizes
            },
        }
        return SimpleNamespace(
            layout=layout,
            xtr=xtr,
            ytr=ytr,
            xva=xva,
            yva=yva,
            generators=generators,
            n_train=n_train,
            per_epoch=per_epoch,
            settings=settings,
            penalties=(any(math.isfinite(c) for c in members.l2_C), any(v > 0 for v in members.l1)),
            uniform_lr=len(set(members.lr)) == 1,
        )

    def _start(self, run: SimpleNamespace, members: Members) -> None:
        """Initial parameters and λ, the best states, the tracker (scored once) and the optimizer state."""
        layout = run.layout
        params = self.model.init(members.seed, self.dtype)
        run.rows = rows = _Rows(
            layout.rows,
            {name: t[layout.rows] for name, t in params.items()},
            {name: t[layout.rows] for name, t in run.settings.items()},
        )
        rows.params["lam"] = self._initial_lambda(members, layout, rows, run.xtr, run.ytr)
        run.best = {
            **{name: t.clone() for name, t in params.items()},
            "lam": torch.empty_like(rows.params["lam"]).index_copy_(0, rows.ids, rows.params["lam"]),
        }
        sign = 1.0 if self.metric.higher_is_better else -1.0

        def score() -> torch.Tensor:
            return sign * layout.reduce(
                run.rows.params, run.rows.ids, run.xva, run.yva, lambda out, y, idx: self.metric.fn(out, y)
            )

        run.score = score
        run.tracker = EarlyStopping(
            torch.empty(len(members), dtype=torch.float64).index_copy_(0, rows.ids, score()),
            self.patience,
            self.min_delta,
        )
        run.rule = self.aggregate.rule if self.aggregate.has_threshold else None
        run.stored = run.rule is not None and run.rule.stored
        run.trained = list(self.model.names) + (["lam"] if run.rule is not None and not run.stored else [])
        rows.state = self.optimizer.init({name: rows.params[name] for name in run.trained})
        run.steps = torch.zeros(len(members), dtype=torch.long)
        run.diverged = torch.zeros(len(members), dtype=torch.bool)
        run.step = 0

    def _train_batch(self, run: SimpleNamespace, positions: torch.Tensor, members: Members, on_stop) -> bool:
        """One step of every running member on its batch ``positions``; True once no member runs."""
        rows, trained = run.rows, run.trained
        leaves = {name: t.detach().requires_grad_(name in trained) for name, t in rows.params.items()}
        outputs, targets = run.layout.train_outputs(leaves, rows.ids, run.xtr, run.ytr, positions)
        losses = self.individual(outputs, targets).reshape(len(rows.ids), -1)
        at_kth = False
        if run.stored:  # each running member's λ by the rule, as the module's own training call sets it
            with torch.no_grad():
                lam = rows.params["lam"]
                used, stored, at_kth = run.rule.member_lam(
                    self.aggregate, losses.detach(), rows.settings["k", positions.shape[1]], rows.settings["delta"],
                    lam, run.step == 0,
                )  # fmt: skip
                keep = rows.running & torch.isfinite(stored)
                leaves["lam"] = torch.where(keep, used, lam)
                rows.params["lam"] = torch.where(keep, stored, lam)
        objective = self._objective(
            leaves, losses, rows.settings, rows.settings["k", positions.shape[1]], run.penalties, at_kth
        )
        finite = torch.isfinite(objective)
        grads = torch.autograd.grad(objective.sum(), [leaves[name] for name in trained])
        run.step += 1
        with torch.no_grad():
            lr = float(members.lr[0]) if run.uniform_lr else rows.settings["lr"]
            rows.params.update(self.optimizer.step(leaves, dict(zip(trained, grads)), rows.state, lr, run.step))
        if run.step % self.eval_every and bool(finite.all()):
            return False
        return self._check_members(run, finite, on_stop)

    def _check_members(self, run: SimpleNamespace, finite: torch.Tensor, on_stop) -> bool:
        """Diverged members, and at validation steps the tracker, best states and patience; the
        members that stop here retire. True once no member runs."""
        rows = run.rows
        stop = rows.running & ~finite
        run.diverged[rows.ids[stop]] = True
        if run.step % self.eval_every == 0:
            live = torch.nonzero(rows.running).flatten()
            improved, patience_out = run.tracker.update(run.step, run.score()[live], rows.ids[live], finite[live])
            for name in run.best:
                run.best[name][rows.ids[live[improved]]] = rows.params[name][live[improved]]
            stop[live[patience_out]] = True
        if not stop.any():
            return False
        stopped = rows.ids[stop]
        if self.report_state == "last":
            kept = stop & ~run.diverged[rows.ids]
            for name in run.best:
                run.best[name][rows.ids[kept]] = rows.params[name][kept]
        run.steps[stopped] = torch.where(run.diverged[stopped], run.step - 1, run.step)
        rows.running &= ~stop
        if on_stop is not None:
            on_stop(len(stopped))
        if run.layout.compacts:
            rows.keep(rows.running, self.optimizer)
        return not rows.running.any()

    def _initial_lambda(self, members: Members, layout, rows: _Rows, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """λ of each row: the given number, or ``auto`` (:func:`initial_threshold` of the initial
        model's training losses), stored through the aggregate's λ constraint."""
        lam = torch.tensor([0.0 if v == "auto" else float(v) for v in members.lam_init], dtype=self.dtype)[rows.ids]
        auto = torch.tensor([v == "auto" for v in members.lam_init])[rows.ids]
        if auto.any():
            batch = min(self.batch_size, x.shape[1])
            k = rows.settings["k", batch]

            def threshold(outputs, targets, idx):
                losses = self.individual(outputs, targets)
                return initial_threshold(losses, k[idx].view(losses.shape[:-1]), batch)

            values = layout.reduce(rows.params, rows.ids, x, y, threshold)
            lam = torch.where(auto, values.to(self.dtype), lam)
        if self.aggregate.has_threshold:
            lam = torch.tensor([self.aggregate.lam_of(v) for v in lam.tolist()], dtype=self.dtype)
        return lam

    def _objective(
        self,
        leaves: dict,
        losses: torch.Tensor,
        settings: dict,
        k: torch.Tensor,
        penalties: tuple[bool, bool],
        at_kth: bool = False,
    ) -> torch.Tensor:
        """Per row: ``aggregate(losses) + 1/(2C)·Σθ² + l1·Σ|W|`` (a penalty no member uses is skipped);
        ``at_kth``: λ is each member's ℓ_[k] (MATk's tied losses share the gradient, as in the module)."""
        if self.aggregate.has_threshold:
            lam = self.aggregate.threshold_of(leaves["lam"])
            value = self.aggregate.batched(losses, k, lam, settings["delta"], at_kth=at_kth)
        else:
            value = self.aggregate.batched(losses, k, None, settings["delta"])
        use_l2, use_l1 = penalties
        if use_l2:
            value = value + settings["inv_2c"] * reduce(
                operator.add, (leaves[n].square().flatten(1).sum(1) for n in self.model.names)
            )
        if use_l1:
            value = value + settings["l1"] * reduce(
                operator.add, (leaves[n].abs().flatten(1).sum(1) for n in self.model.weights)
            )
        return value

    def _threshold_diagnostics(self, layout, best: dict, lam: torch.Tensor, ks: Sequence, groups: Sequence) -> dict:
        """Where each member's reported λ sits among its own training losses at the reported state (member
        order, float64): ``hard_share``, the share of the losses above λ, and ``lam_minus_kth``, λ − ℓ_[k]
        with k = the member's k of its whole training split (a fraction of it, or the count). A hard share
        of 1 means λ lies below every loss: the member dropped no sample."""
        rows = layout.rows
        x, y = _stack(groups, "train", self.dtype)
        in_layout = {name: t[rows] for name, t in best.items()}
        lam_rows = lam[rows].double()
        k_rows = torch.tensor([resolve_k(k, x.shape[1]) for k in ks], dtype=torch.long)[rows]

        def losses_of(out, targets, idx):
            losses = self.individual(out, targets).double()
            return losses, lam_rows[idx].view(losses.shape[:-1] + (1,))

        def hard_share(out, targets, idx):
            losses, at = losses_of(out, targets, idx)
            return (losses > at).double().mean(-1)

        def lam_minus_kth(out, targets, idx):
            losses, at = losses_of(out, targets, idx)
            k = k_rows[idx].view(losses.shape[:-1] + (1,))
            kth = losses.sort(-1, descending=True).values.gather(-1, k - 1)
            return (at - kth).squeeze(-1)

        diagnostics = {}
        for name, fn in (("hard_share", hard_share), ("lam_minus_kth", lam_minus_kth)):
            values = layout.reduce(in_layout, rows, x, y, fn)
            diagnostics[name] = torch.empty_like(values).index_copy_(0, rows, values)
        return diagnostics

    def _result(self, layout, best: dict, tracker: EarlyStopping, steps, diverged, groups, report) -> dict:
        lam = best["lam"]
        result = {
            "best_step": tracker.best_step.clone(),
            "steps": steps,
            "diverged": diverged,
            "lambda": self.aggregate.threshold_of(lam).detach() if self.aggregate.has_threshold else lam,
            "params": {name: best[name] for name in self.model.names},
        }
        rows = layout.rows
        in_layout = {name: t[rows] for name, t in best.items()}
        for part in report:
            x, y = _stack(groups, part, self.dtype)
            values = layout.reduce(in_layout, rows, x, y, lambda out, t, idx: self.metric.fn(out, t))
            result[f"{part}_{self.metric.name}"] = torch.empty_like(values).index_copy_(0, rows, values)
        return result
