"""One cell of a paper table: every grid combination of one aggregate, trained on every split as
one population, then the combination with the best validation score over the splits is selected
(exact total error counts, or mean RMSE); the combinations tied with it are recorded."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from topklab.engine.aggregates import aggregate_node, with_lam_update
from topklab.engine.functional_optim import Adagrad
from topklab.engine.population import Gathered, Members, Metric, PopulationExecutor
from topklab.engine.stacked import StackedMLP
from topklab.losses.aggregate import Aggregate
from topklab.losses.aggregate.lambda_rules import PAPER, RULES, is_trained
from topklab.protocol.grid import Grid
from topklab.tasks.metrics import TASK_METRIC
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError


@dataclass(frozen=True)
class Cell:
    """(table, dataset, individual loss, aggregate): the unit that is trained, stored and resumed."""

    table: str
    dataset: str
    individual: str
    aggregate: str

    @property
    def key(self) -> str:
        return f"{self.table}/{self.dataset}/{self.individual}/{self.aggregate}"


COMMITTED_COMPILE_MIN_N = 16384  # the committed cells' kernel path: MATk/STk eager below 16,384 losses

_THRESHOLD = {  # MATk's and STk's λ fields as the members ran them (the paper's update, the eager kernel path)
    "lam_update": "gradient",
    "lam_lr": None,
    "lam_momentum": 0.1,
    "lam_init": "auto",
    "lam_constraint": "none",
    "scale": "paper",
    "kernel": "auto",
    "compile_min_n": COMMITTED_COMPILE_MIN_N,
}
COMMITTED_LOSS = {  # the members' loss config (Protocol.members_aggregate) of cells stored before the fingerprint held it
    "average": {"_target_": "topklab.losses.Average"},
    "maximum": {"_target_": "topklab.losses.Maximum"},
    "atk": {"_target_": "topklab.losses.ATk", "k": 0.9, "method": "topk"},
    "matk": {"_target_": "topklab.losses.MATk", "k": 0.9, **_THRESHOLD},
    "stk": {
        "_target_": "topklab.losses.STk",
        "k": 0.9,
        "delta": 0.01,
        "smoothing": "srelu",
        "solve_steps": 2,
        **_THRESHOLD,
    },
}


@dataclass(frozen=True)
class Protocol:
    """How every member is trained and how many splits a combination is averaged over.

    Parameters
    ----------
    grid : Grid
    n_splits : int >= 1, random train/val/test splits per combination (paper: 50). Split i uses
        ``split_seed = i`` and training seed ``seed + i``, for every combination and aggregate,
        so the per-split results of two aggregates are paired.
    seed : int >= 0, offset of the training seeds (model init and batch order)
    max_epochs : int >= 1, cap on epochs for members that never stop early (the paper: "train to
        convergence"; our choice)
    batch_size, patience, eval_every, min_delta : mini-batches and early stopping as in
        :class:`topklab.engine.population.PopulationExecutor`; the paper: batch 16, stop when
        validation improved by less than 1e-6 after 50 steps
    hidden : int, hidden units of the 2-layer MLP (paper: 10)
    lam_init : float, initial λ of MATk/STk (the paper is silent; our choice)
    lam_update : a rule name of :mod:`~topklab.losses.aggregate.lambda_rules`, or None (default) for the
        paper's SGD-STk (λ trained at each member's η); each member's λ follows the rule as a module's
        own would (:meth:`~topklab.losses.aggregate.lambda_rules.LambdaRule.member_lam`). The paper's
        update leaves the fingerprint as it was before this field
    max_members : int, largest population trained at once (bounds memory)
    compile_min_n : int >= 1 or None, MATk/STk's ``compile_min_n`` for the members (their kernel path):
        16384 (default) keeps the batch-16 rows on the eager kernel, the path the committed cells ran;
        None is the loss configs' default, the C++ kernel (the same values to float32 rounding); a
        value other than 16384 enters the fingerprint
    """

    grid: Grid
    n_splits: int = 50
    seed: int = 0
    max_epochs: int = 200
    batch_size: int = 16
    patience: int = 50
    eval_every: int = 50
    min_delta: float = 1e-6
    hidden: int = 10
    lam_init: float = 0.0
    max_members: int = 70_000
    lam_update: str | None = None
    compile_min_n: int | None = COMMITTED_COMPILE_MIN_N

    def __post_init__(self):
        for name in ("n_splits", "max_epochs", "batch_size", "patience", "eval_every", "hidden", "max_members"):
            value = getattr(self, name)
            check_int(f"preset.{name}", value, error=TopklabError)
        check_int("preset.seed", self.seed, 0, error=TopklabError)
        if not self.min_delta >= 0:
            raise TopklabError(f"preset.min_delta={self.min_delta!r} must be >= 0")
        check_int("preset.compile_min_n", self.compile_min_n, 1, allow_none=True, error=TopklabError)
        if self.lam_update is not None and self.lam_update not in RULES:
            raise TopklabError(f"preset.lam_update={self.lam_update!r}; choose one of: {', '.join(RULES)}")

    def members_aggregate(self, config: DictConfig) -> DictConfig:
        """Loss config ``config`` as the members train with it: λ by ``lam_update``
        (:func:`~topklab.engine.aggregates.with_lam_update`), the kernel path by ``compile_min_n``."""
        config = with_lam_update(config, PAPER if self.lam_update is None else self.lam_update)
        if "compile_min_n" in config:
            config.compile_min_n = self.compile_min_n
        return config

    def fingerprint(self, aggregate: str) -> dict:
        """Everything that determines a cell's numbers (stored with it, compared on resume)."""
        fields = asdict(self)
        fields.pop("max_members")
        if is_trained(PAPER if self.lam_update is None else self.lam_update):  # as stored before the field existed
            fields.pop("lam_update")
        if fields["compile_min_n"] == COMMITTED_COMPILE_MIN_N:  # the kernel path as stored before the field existed
            fields.pop("compile_min_n")
        fields["grid"] = self.grid.combos(aggregate)
        return fields


RMSE_TIE_TOLERANCE = 1e-9  # relative: RMSE means this close are one score (float noise of identical models)


def selection_scores(val: np.ndarray, metric: str, val_sizes) -> np.ndarray:
    """What selection compares, per combination: the total number of validation errors over the
    splits (an integer, for ``error_pct``: compared exactly) or the mean validation RMSE; NaN where
    a split is non-finite.

    Examples
    --------
    >>> selection_scores(np.array([[50.0, 25.0], [25.0, 50.0]]), "error_pct", [4, 4]).tolist()
    [3.0, 3.0]
    """
    if metric != "error_pct":
        return val.mean(axis=1)
    counts = val * np.asarray(val_sizes, dtype=float)[None, :] / 100
    finite = np.isfinite(counts)
    rounded = np.rint(np.where(finite, counts, 0.0))
    if finite.any() and np.abs(counts - rounded)[finite].max() > 1e-3:
        raise TopklabError(
            "validation error rates are not whole counts of the validation sets; the metric is not error_pct"
        )
    return np.where(finite.all(axis=1), rounded.sum(axis=1), np.nan)


def select_combo(scores: np.ndarray, exact: bool = True) -> tuple[int, list[int]]:
    """``(index, tied)``: the combination with the lowest score (:func:`selection_scores`) and every
    combination tied with it, in grid order; the first tied one is selected.

    Scores tie when equal (``exact``: integer error totals) or within a relative
    :data:`RMSE_TIE_TOLERANCE`; a combination with a non-finite score is never chosen, and if every
    combination has one that is an error.

    Examples
    --------
    >>> select_combo(np.array([6.0, 4.0, 5.0, 4.0]))
    (1, [1, 3])
    """
    finite = np.isfinite(scores)
    if not finite.any():
        raise TopklabError(
            "every combination has a non-finite validation metric; check the data and lower the grid's lr"
        )
    best = scores[finite].min()
    tolerance = 0.0 if exact else RMSE_TIE_TOLERANCE * max(abs(best), 1e-12)
    tied = [int(i) for i in np.flatnonzero(finite & (scores <= best + tolerance))]
    return tied[0], tied


THRESHOLD_DIAGNOSTICS = (
    "hard_share",
    "lam_minus_kth",
)  # per split, MATk/STk cells: where λ sits in the training losses


def run_cell(
    cell: Cell,
    dataset,
    individual: nn.Module,
    protocol: Protocol,
    settings: dict | None = None,
    on_retire: Callable[[int], None] | None = None,
    aggregate: Aggregate | None = None,
) -> dict:
    """Train ``cell`` by ``protocol`` on ``dataset`` (a TabularDataset); return its JSON record.
    ``settings`` (e.g. the dataset and loss configs) joins the protocol in the record's
    ``fingerprint``, which decides whether a stored cell may be reused.

    ``aggregate`` is the aggregate module whose fixed settings (scale, smoothing, λ constraint)
    every member uses, k/C/η/δ coming from the grid; default ``configs/loss/<cell.aggregate>.yaml``
    (the paper's scale, SReLU, no λ constraint). Every member is the 2-layer MLP with AdaGrad;
    members stop and retire independently (:class:`~topklab.engine.population_layout.Gathered`)."""
    start = time.perf_counter()
    combos = protocol.grid.combos(cell.aggregate)
    splits = [dataset.splits(split_seed=i) for i in range(protocol.n_splits)]
    metric = TASK_METRIC[dataset.task][0]
    reported = ("train", "val", "test")
    columns: dict[str, list] = {}
    member_steps = 0
    rows = [(c, s) for c in range(len(combos)) for s in range(protocol.n_splits)]
    per_population = max(protocol.n_splits, protocol.max_members // protocol.n_splits * protocol.n_splits)
    if aggregate is None:
        aggregate = instantiate(protocol.members_aggregate(aggregate_node(cell.aggregate)))
    executor = PopulationExecutor(
        aggregate,
        individual,
        StackedMLP(splits[0].n_features, protocol.hidden),
        Adagrad(),
        Metric(metric, TASK_METRIC[dataset.task][1], higher_is_better=False),
        max_epochs=protocol.max_epochs,
        batch_size=protocol.batch_size,
        eval_every=protocol.eval_every,
        patience=protocol.patience,
        min_delta=protocol.min_delta,
        layout=Gathered,
    )
    for first in range(0, len(rows), per_population):
        chunk = rows[first : first + per_population]
        members = Members(
            split=[s for _, s in chunk],
            seed=[protocol.seed + s for _, s in chunk],
            k=[combos[c]["k"] for c, _ in chunk],
            lr=[combos[c]["lr"] for c, _ in chunk],
            l2_C=[combos[c]["C"] for c, _ in chunk],
            delta=[combos[c]["delta"] for c, _ in chunk],
            lam_init=protocol.lam_init,
        )
        result = executor.fit(splits, members, report=reported, on_stop=on_retire)
        member_steps += int(result["steps"].sum())
        for name in ("best_step", "steps", "lambda", "diverged", *(f"{part}_{metric}" for part in reported)):
            columns.setdefault(name, []).append(result[name])
        for name in THRESHOLD_DIAGNOSTICS:
            if name in result:
                columns.setdefault(name, []).append(result[name])
    table = {
        name: torch.cat(parts).double().numpy().reshape(len(combos), protocol.n_splits)
        for name, parts in columns.items()
    }
    val, test = table[f"val_{metric}"], table[f"test_{metric}"]
    scores = selection_scores(val, metric, [len(split.y_val) for split in splits])
    best, tied = select_combo(scores, exact=metric == "error_pct")
    tied_test = test[tied].mean(axis=1)
    return {
        "cell": asdict(cell),
        "data": splits[0].info,
        "metric": metric,
        "fingerprint": {"protocol": protocol.fingerprint(cell.aggregate), **(settings or {})},
        "selected": {"index": best, **combos[best]},
        "ties": {  # the combinations whose validation score equals the selected one's (the first in grid order is selected)
            "rule": "first in grid order"
            if metric == "error_pct"
            else f"first in grid order; RMSE within {RMSE_TIE_TOLERANCE:g} (relative)",
            "count": len(tied),
            "indices": tied,
            "test_min": float(tied_test.min()),
            "test_max": float(tied_test.max()),
            "test_mean": float(tied_test.mean()),
        },
        "test_mean": float(test[best].mean()),
        "test_std": float(test[best].std()),
        "per_split": {
            "split_seed": list(range(protocol.n_splits)),
            "seed": [protocol.seed + s for s in range(protocol.n_splits)],
            "test": test[best].tolist(),
            "val": val[best].tolist(),
            "train": table[f"train_{metric}"][best].tolist(),
            "best_step": table["best_step"][best].astype(int).tolist(),
            "steps": table["steps"][best].astype(int).tolist(),
            "lambda": table["lambda"][best].tolist(),
            "diverged": table["diverged"][best].astype(bool).tolist(),
            **{name: table[name][best].tolist() for name in THRESHOLD_DIAGNOSTICS if name in table},
        },
        "combos": {  # every combination, column by column (grid order)
            **{axis: [combo[axis] for combo in combos] for axis in ("k", "C", "lr", "delta")},
            "val_mean": [round(float(v), 6) for v in val.mean(axis=1)],
            "val_score": [
                None if not math.isfinite(v) else (int(v) if metric == "error_pct" else float(v))
                for v in scores.tolist()
            ],
            "test_mean": [round(float(v), 6) for v in test.mean(axis=1)],
            "diverged": table["diverged"].sum(axis=1).astype(int).tolist(),
        },
        "members": len(rows),
        "member_steps": member_steps,
        "seconds": round(time.perf_counter() - start, 3),
    }
