"""The STk paper's §4.2 experiments from one config: Table 2 (accuracy, ParaF1, time per column),
Figure 3 (2-D boundaries beside the LDA one) and Figure 4 (sensitivity to the negative ratio).

Each experiment returns a JSON-ready dict; ``run`` writes them atomically with the resolved config,
command and provenance. k is not given by the paper for this experiment: every k-using column picks
it from ``k_grid`` by validation accuracy averaged over the repeats (as §5.1 does for its grid).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from topklab.report import make_result, mean_std, write_result
from topklab.synthetic.gaussian import GaussianTask
from topklab.synthetic.lda import lda_boundary
from topklab.synthetic.paraf1 import para_f1
from topklab.synthetic.train import Column, SyntheticTrainer, accuracy, train_logistic
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import collect, portable_config

EXPERIMENTS = ("table2", "figure3", "figure4")


def make_repeats(task: GaussianTask, sizes, positive_fraction: float, repeats: int, data_seed: int):
    """Per repeat r a fresh (train, val, test) from its own generator ``data_seed + r``; train has
    ``positive_fraction`` positives, validation and test are 1:1."""
    train, val, test = [], [], []
    for r in range(repeats):
        g = torch.Generator().manual_seed(data_seed + r)
        train.append(task.sample(sizes.train, positive_fraction, g))
        val.append(task.sample(sizes.val, 0.5, g))
        test.append(task.sample(sizes.test, 0.5, g))
    return train, val, test


def column_of(spec) -> Column:
    """A column spec ``{aggregate: stk, smoothing: elu}``: the loss config and overrides of its fields."""
    fields = OmegaConf.to_container(spec, resolve=True)
    return Column(aggregate=fields.pop("aggregate"), overrides=fields)


def evaluate_column(column: Column, k_grid, data, seeds, settings: SyntheticTrainer, scale: str,
                    w_star: torch.Tensor, support_tol: float) -> dict:
    """Train the column at every k of the grid on every repeat, keep the k with the best mean
    validation accuracy (ties: first), and report its per-repeat test accuracy and ParaF1."""
    train, val, test = data
    grid = list(k_grid) if column.uses_k else [1]
    start = time.perf_counter()
    fit = train_logistic(column, settings, train, val, seeds, grid, scale)
    seconds = time.perf_counter() - start
    mean_val = fit["val_acc"].mean(0)
    pick = int(torch.argmax(mean_val))  # first maximum
    w, b = fit["w"][:, pick], fit["b"][:, pick]
    test_acc = torch.stack([accuracy(t.x @ w[r] + b[r], t.y) for r, t in enumerate(test)])
    f1 = para_f1(w, w_star, support_tol)
    return {
        "k": grid[pick] if column.uses_k else None,
        "val_acc_by_k": [float(v) for v in mean_val],
        "test_acc": [100 * float(v) for v in test_acc],
        "paraf1": [float(v) for v in f1],
        "best_step": fit["best_step"][:, pick].tolist(),
        "lambda": [float(v) for v in fit["lam"][:, pick]],
        "w": w.tolist(),
        "b": b.tolist(),
        "population_seconds": seconds,
    }


def settings_of(cfg: DictConfig, overrides=None) -> SyntheticTrainer:
    fields = OmegaConf.to_container(cfg.trainer, resolve=True)
    fields.update(OmegaConf.to_container(overrides, resolve=True) if overrides else {})
    fields["betas"] = tuple(fields.get("betas", (0.9, 0.999)))
    return SyntheticTrainer(**fields)


def task_of(cfg: DictConfig) -> GaussianTask:
    return GaussianTask(**OmegaConf.to_container(cfg, resolve=True))


def table2(cfg: DictConfig, log=print) -> dict:
    task = task_of(cfg.task)
    settings = settings_of(cfg)
    data = make_repeats(task, cfg.sizes, cfg.positive_fraction, cfg.repeats, cfg.data_seed)
    seeds = [cfg.seed + r for r in range(cfg.repeats)]
    w_star = task.mean_pos - task.mean_neg  # the paper's w*: its first n_signal entries (papers.md §1.10)
    columns = {}

    def single_model_seconds(column: Column, k, r: int) -> float:
        """Table 2 "Time": one model (the executor with one member) trained on repeat r."""
        start = time.perf_counter()
        train_logistic(column, settings, [data[0][r]], [data[1][r]], [seeds[r]], [k], cfg.scale)
        return time.perf_counter() - start

    single_model_seconds(Column("average"), 1, 0)  # warm-up, not timed
    for name, spec in cfg.table2.columns.items():
        column = column_of(spec)
        out = evaluate_column(column, cfg.k_grid, data, seeds, settings, cfg.scale, w_star, cfg.support_tol)
        times = [single_model_seconds(column, out["k"] or 1, r) for r in range(min(cfg.time_repeats, cfg.repeats))]
        out["seconds_single"] = times
        out.pop("w")
        columns[name] = out
        log(f"table2 {name}: acc {mean_std(out['test_acc'])[0]:.2f}%  ParaF1 {mean_std(out['paraf1'])[0]:.3f}  "
            f"k={out['k']}  time {mean_std(times)[0]:.2f} s/model")
    lda_w, lda_b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, cfg.positive_fraction)
    return {"columns": columns, "order": list(columns), "bayes_accuracy_balanced_test": 100 * task.bayes_accuracy(0.5),
            "lda_support": int((lda_w.abs() > 1e-9).sum())}


def figure3(cfg: DictConfig, log=print) -> dict:
    spec = cfg.figure3
    task = GaussianTask(d=2, n_signal=2, shift=spec.shift, rho=spec.rho)
    settings = settings_of(cfg, spec.get("trainer"))
    data = make_repeats(task, spec.sizes, spec.positive_fraction, 1, cfg.data_seed)
    lda_w, lda_b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, spec.positive_fraction)
    boundaries = {}
    for name, col in spec.columns.items():
        out = evaluate_column(column_of(col), cfg.k_grid, data, [cfg.seed], settings, cfg.scale,
                              lda_w, cfg.support_tol)
        boundaries[name] = {"w": out["w"][0], "b": out["b"][0], "k": out["k"], "test_acc": out["test_acc"][0]}
        log(f"figure3 {name}: w={[round(v, 3) for v in out['w'][0]]} b={out['b'][0]:.3f} k={out['k']}")
    shown = data[0][0]
    return {"lda": {"w": lda_w.tolist(), "b": lda_b}, "boundaries": boundaries,
            "points": {"x": shown.x[: spec.points].tolist(), "y": shown.y[: spec.points].tolist()}}


def figure4(cfg: DictConfig, log=print) -> dict:
    task = task_of(cfg.task)
    settings = settings_of(cfg)
    w_star = task.mean_pos - task.mean_neg
    seeds = [cfg.seed + r for r in range(cfg.repeats)]
    by_ratio = {}
    for ratio in cfg.figure4.negative_ratios:
        if not 0 < ratio < 1:
            raise TopklabError(f"figure4 negative ratio {ratio} must lie in (0, 1)")
        data = make_repeats(task, cfg.sizes, 1.0 - ratio, cfg.repeats, cfg.data_seed)
        row = {}
        for name, spec in cfg.figure4.columns.items():
            out = evaluate_column(column_of(spec), cfg.k_grid, data, seeds, settings, cfg.scale, w_star,
                                  cfg.support_tol)
            row[name] = {"k": out["k"], "test_acc": out["test_acc"], "paraf1": out["paraf1"]}
            log(f"figure4 ratio {ratio} {name}: acc {mean_std(out['test_acc'])[0]:.2f}%  "
                f"ParaF1 {mean_std(out['paraf1'])[0]:.3f}")
        by_ratio[str(ratio)] = row
    return {"negative_ratios": list(cfg.figure4.negative_ratios), "by_ratio": by_ratio,
            "order": list(cfg.figure4.columns)}


RUNNERS = {"table2": table2, "figure3": figure3, "figure4": figure4}


def run(cfg: DictConfig, log=print) -> list[Path]:
    """Run ``cfg.experiments`` and write ``<results_dir>/<name>.json`` for each (atomically)."""
    unknown = [e for e in cfg.experiments if e not in RUNNERS]
    if unknown:
        raise TopklabError(f"unknown synthetic experiment(s) {unknown}; choose from: {', '.join(EXPERIMENTS)}")
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise TopklabError(f"repeats={cfg.repeats!r} must be an int >= 1")
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    provenance = collect(cfg.paths.root_dir)
    written = []
    for name in cfg.experiments:
        start = time.perf_counter()
        payload = RUNNERS[name](cfg, log)
        payload["seconds"] = time.perf_counter() - start
        result = make_result("synthetic", name, payload, command=" ".join(["python", *sys.argv]),
                             config=portable_config(cfg), provenance=provenance)
        written.append(write_result(Path(cfg.results_dir) / f"{name}.json", result))
        log(f"wrote {written[-1]} ({payload['seconds']:.0f} s)")
    return written
