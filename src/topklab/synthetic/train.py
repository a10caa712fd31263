"""Logistic regression on the synthetic Gaussian data (STk paper §4.2): binary cross-entropy per
sample, an aggregate over the batch, an l1 term on the weights, Adam, batch 512, early stopping on
validation accuracy, run by the population executor (:mod:`topklab.engine.population`).

:func:`train_logistic` trains R repeats × M values of k at once: member (r, m) trains on
``train[r]`` with seed ``seeds[r]`` and ``k[m]``; the M members of a repeat share its mini-batches
(the executor's grouped layout: one (R, B, d) batch feeds all R·M models), and a member that stops
is frozen at its best state. One repeat and one k is a single model: that is what the Table 2
"Time" row times (tests check members against a plain ``torch.optim.Adam`` loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from topklab.engine.aggregates import aggregate_class, build_paper_update_aggregate
from topklab.engine.functional_optim import Adam
from topklab.engine.population import DataGroup, Grouped, Members, Metric, PopulationExecutor
from topklab.engine.stacked import StackedLinear
from topklab.engine.stopping import REPORT_STATES
from topklab.losses.aggregate import Aggregate
from topklab.losses.individual.base import scores_of
from topklab.synthetic.gaussian import SyntheticSplit
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError


@dataclass(frozen=True)
class Column:
    """A Table 2 column: an aggregate's loss-config name and overrides of its fields (for STk the
    ReLU variant, e.g. ``{"smoothing": "elu"}``)."""

    aggregate: str  # average | maximum | atk | matk | stk (configs/loss/<name>.yaml)
    overrides: dict = field(default_factory=dict)
    trainer: dict = field(default_factory=dict)  # this column's own trainer settings (e.g. lam_init)

    @property
    def uses_k(self) -> bool:
        return "k" in aggregate_class(self.aggregate).hyperparameters

    @property
    def uses_lambda(self) -> bool:
        return aggregate_class(self.aggregate).has_threshold

    def module(self, scale: str) -> Aggregate:
        """The column's aggregate; ``scale`` (paper | atk) applies to those with a threshold λ."""
        return build_paper_update_aggregate(
            self.aggregate, **{**self.overrides, **({"scale": scale} if self.uses_lambda else {})}
        )


@dataclass
class SyntheticTrainer:
    """Training settings of the synthetic experiments.

    Parameters
    ----------
    batch_size : int >= 1 (paper: 512)
    lr : float > 0, Adam step size (paper: "default", 1e-3); betas/eps are PyTorch's defaults
    l1 : float >= 0, coefficient of ``l1·‖w‖₁`` (paper: not given; our choice, a config field)
    delta : float > 0, SReLU δ (paper: 0.01)
    lam_init : float or "auto", initial λ of MATk/STk. ``auto`` starts λ at its optimum for the
        initial model: the round(n·k/B)-th largest per-sample training loss at initialisation (see
        :func:`topklab.engine.population.initial_threshold`). The paper does not say how λ starts.
    eval_every : int >= 1, steps between validation evaluations
    patience, min_delta : stop once validation accuracy (a fraction) has not risen by more than
        ``min_delta`` for ``patience`` steps (paper: 1e-4 within 200 steps); roll back to the best
    max_epochs : int >= 1, cap for members that never stop
    report_state : best | last, the state a member returns: its best-validation state (roll-back) or
        the state it stopped in (Figure 3's boundaries after training to the cap)
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
    report_state: str = "best"

    def __post_init__(self):
        for name in ("batch_size", "eval_every", "patience", "max_epochs"):
            value = getattr(self, name)
            check_int(f"synthetic trainer {name}", value, error=TopklabError)
        if self.report_state not in REPORT_STATES:
            raise TopklabError(
                f"synthetic trainer report_state={self.report_state!r}; choose one of {', '.join(REPORT_STATES)}"
            )
        if self.lam_init != "auto" and not isinstance(self.lam_init, (int, float)):
            raise TopklabError(f"synthetic trainer lam_init={self.lam_init!r} must be a number or 'auto'")
        if not self.lr > 0 or not self.delta > 0 or self.l1 < 0 or self.min_delta < 0:
            raise TopklabError(
                f"synthetic trainer needs lr > 0, delta > 0, l1 >= 0, min_delta >= 0; got "
                f"lr={self.lr}, delta={self.delta}, l1={self.l1}, min_delta={self.min_delta}"
            )


class BinaryCrossEntropy(nn.Module):
    """Per-sample logistic loss for labels y ∈ {0, 1}: ``BCE-with-logits(f, y) = log(1 + exp(−(2y−1)·f))``,
    the value of :class:`~topklab.losses.Logistic` on labels 2y − 1. Kept in this form because the
    synthetic results were computed with it (the two round differently). No reduction.

    Examples
    --------
    >>> BinaryCrossEntropy()(torch.tensor([[0.0], [2.0]]), torch.tensor([1.0, 0.0]))
    tensor([0.6931, 2.1269])
    """

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        scores = scores_of(output)
        return F.binary_cross_entropy_with_logits(scores, target.to(scores.dtype).expand_as(scores), reduction="none")


def accuracy(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Fraction of samples where ``score > 0`` matches ``y`` ∈ {0, 1}, along the sample axis;
    ``output`` is (n,), (n, 1) or (P, n, 1).

    Examples
    --------
    >>> float(accuracy(torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1.0, 1.0, 1.0])))
    0.6666666666666666
    """
    scores = scores_of(output)
    return ((scores > 0).to(y.dtype) == y).double().mean(-1)


def train_logistic(
    column: Column,
    settings: SyntheticTrainer,
    train: list[SyntheticSplit],
    val: list[SyntheticSplit],
    seeds: list[int],
    k: list,
    scale: str = "paper",
) -> dict:
    """Train R × M logistic regressions: member (r, m) on ``train[r]``/``val[r]`` with seed
    ``seeds[r]`` and ``k[m]`` (ignored by columns without k; pass ``[1]``).

    Returns (R, M) tensors ``b``, ``lam`` (NaN for columns without λ), ``best_step``, ``steps``,
    ``val_acc`` (of the best state) and ``w`` (R, M, d).
    """
    if not len(train) == len(val) == len(seeds):
        raise TopklabError("train, val and seeds need one entry per repeat")
    repeats, ks = len(train), list(k)
    executor = PopulationExecutor(
        column.module(scale),
        BinaryCrossEntropy(),
        StackedLinear(train[0].x.shape[1]),
        Adam(settings.betas, settings.eps),
        Metric("acc", accuracy, higher_is_better=True),
        max_epochs=settings.max_epochs,
        batch_size=settings.batch_size,
        eval_every=settings.eval_every,
        patience=settings.patience,
        min_delta=settings.min_delta,
        layout=Grouped,
        report_state=settings.report_state,
    )
    groups = [DataGroup(t.x, t.y, v.x, v.y) for t, v in zip(train, val)]
    members = Members(
        split=[r for r in range(repeats) for _ in ks],
        seed=[seeds[r] for r in range(repeats) for _ in ks],
        k=ks * repeats,
        lr=settings.lr,
        l1=settings.l1,
        delta=settings.delta,
        lam_init=settings.lam_init,
    )
    fit = executor.fit(groups, members, report=("val",))
    shape = (repeats, len(ks))
    lam = fit["lambda"] if column.uses_lambda else torch.full((len(members),), float("nan"))
    return {
        "w": fit["params"]["w"][:, 0, :].reshape(*shape, -1),
        "b": fit["params"]["b"][:, 0].reshape(shape),
        "lam": lam.reshape(shape),
        "best_step": fit["best_step"].reshape(shape),
        "steps": fit["steps"].reshape(shape),
        "val_acc": fit["val_acc"].reshape(shape),
    }
