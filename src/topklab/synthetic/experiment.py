"""The STk paper's §4.2 experiments from one config: Table 2 (accuracy, ParaF1, time per column),
Figure 3 (2-D boundaries beside the LDA one) and Figure 4 (sensitivity to the negative ratio).

Each experiment returns a JSON-ready dict; ``run`` writes them atomically with the resolved config,
command and provenance. k is not given by the paper for this experiment: every k-using column picks
it from ``k_grid`` by validation accuracy averaged over the repeats (as §5.1 does for its grid).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
from hydra import compose
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from topklab.config import check_one_process_command
from topklab.engine.result_guard import compare_with_stored, read_stored, refusal, replaced_record, stored_differences
from topklab.engine.run_identity import identity
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


def columns_of(rows) -> dict[str, Column]:
    """Label -> :class:`Column` for experiment rows (``stk/table2/stk_elu`` ...), in the given order:
    each row is composed by Hydra, and its column is the loss it chooses with all of that loss's
    fields (e.g. ``smoothing: elu``). Needs an initialised Hydra (the script's ``@hydra.main``)."""
    columns = {}
    for row in rows:
        try:
            cfg = compose("train", overrides=[f"experiment={row}"], return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as err:
            raise TopklabError(f"synthetic column {row!r}: {' '.join(str(err).split())}") from None
        if cfg.get("row") is None:  # the experiment group is optional: an unknown row composes to nothing
            raise TopklabError(
                f"synthetic column {row!r} is not an experiment row with a label; "
                f"choose from configs/experiment/stk/{{table2,figure3,figure4}}/"
            )
        fields = OmegaConf.to_container(cfg.loss, resolve=True)
        fields.pop("_target_")
        trainer = OmegaConf.to_container(cfg.synthetic_trainer, resolve=True) if cfg.get("synthetic_trainer") else {}
        columns[cfg.row] = Column(aggregate=cfg.hydra.runtime.choices.loss, overrides=fields, trainer=trainer)
    return columns


def reference_supports(task: GaussianTask) -> dict[str, torch.Tensor]:
    """The weight vectors ParaF1 scores against: ``true``, the Bayes direction Σ⁻¹(μ₁ − μ₀) (11
    non-zeros), and ``paper``, the paper's w* = μ₁ − μ₀ (its first 10 entries; papers.md §1.10)."""
    return {"true": task.bayes_direction(), "paper": task.mean_pos - task.mean_neg}


def evaluate_column(
    column: Column,
    k_grid,
    data,
    seeds,
    settings: SyntheticTrainer,
    scale: str,
    supports: dict[str, torch.Tensor],
    support_tol: float,
) -> dict:
    """Train the column at every k of the grid on every repeat, keep the k with the best mean
    validation accuracy (ties: first), and report its per-repeat test accuracy, ParaF1 against each
    reference weight vector of ``supports`` (``paraf1`` for the key ``true``, ``paraf1_<key>`` for
    others), best and total steps, and the step cap."""
    train, val, test = data
    grid = list(k_grid) if column.uses_k else [1]
    settings = dataclasses.replace(settings, **column.trainer)
    start = time.perf_counter()
    fit = train_logistic(column, settings, train, val, seeds, grid, scale)
    seconds = time.perf_counter() - start
    mean_val = fit["val_acc"].mean(0)
    pick = int(torch.argmax(mean_val))  # first maximum
    w, b = fit["w"][:, pick], fit["b"][:, pick]
    test_acc = torch.stack([accuracy(t.x @ w[r] + b[r], t.y) for r, t in enumerate(test)])
    scores = {
        ("paraf1" if name == "true" else f"paraf1_{name}"): [float(v) for v in para_f1(w, ref, support_tol)]
        for name, ref in supports.items()
    }
    return {
        "k": grid[pick] if column.uses_k else None,
        "val_acc_by_k": [float(v) for v in mean_val],
        "test_acc": [100 * float(v) for v in test_acc],
        **scores,
        "best_step": fit["best_step"][:, pick].tolist(),
        "steps": fit["steps"][:, pick].tolist(),
        "step_cap": settings.max_epochs * (len(train[0].y) // settings.batch_size),
        "trainer": column.trainer,
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


def table2(cfg: DictConfig, columns_by_label: dict[str, Column], log=print) -> dict:
    task = task_of(cfg.task)
    settings = settings_of(cfg)
    data = make_repeats(task, cfg.sizes, cfg.positive_fraction, cfg.repeats, cfg.data_seed)
    seeds = [cfg.seed + r for r in range(cfg.repeats)]
    supports = reference_supports(task)
    columns = {}

    def single_model_seconds(column: Column, k, r: int) -> float:
        """Table 2 "Time": one model (the executor with one member) trained on repeat r."""
        start = time.perf_counter()
        train_logistic(column, settings, [data[0][r]], [data[1][r]], [seeds[r]], [k], cfg.scale)
        return time.perf_counter() - start

    single_model_seconds(Column("average"), 1, 0)  # warm-up, not timed
    for name, column in columns_by_label.items():
        out = evaluate_column(column, cfg.k_grid, data, seeds, settings, cfg.scale, supports, cfg.support_tol)
        times = [single_model_seconds(column, out["k"] or 1, r) for r in range(min(cfg.time_repeats, cfg.repeats))]
        out["seconds_single"] = times
        out.pop("w")
        columns[name] = out
        log(
            f"table2 {name}: acc {mean_std(out['test_acc'])[0]:.2f}%  ParaF1 {mean_std(out['paraf1'])[0]:.3f}  "
            f"k={out['k']}  time {mean_std(times)[0]:.2f} s/model"
        )
    lda_w, lda_b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, cfg.positive_fraction)
    return {
        "columns": columns,
        "order": list(columns),
        "bayes_accuracy_balanced_test": 100 * task.bayes_accuracy(0.5),
        "lda_support": int((lda_w.abs() > 1e-9).sum()),
        "true_support": torch.nonzero(supports["true"]).flatten().tolist(),
        "paper_support": torch.nonzero(supports["paper"]).flatten().tolist(),
    }


def figure3(cfg: DictConfig, columns_by_label: dict[str, Column], log=print) -> dict:
    spec = cfg.figure3
    task = GaussianTask(d=2, n_signal=2, shift=spec.shift, rho=spec.rho)
    settings = settings_of(cfg, spec.get("trainer"))
    data = make_repeats(task, spec.sizes, spec.positive_fraction, 1, cfg.data_seed)
    lda_w, lda_b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, spec.positive_fraction)
    boundaries = {}
    for name, column in columns_by_label.items():
        out = evaluate_column(
            column, cfg.k_grid, data, [cfg.seed], settings, cfg.scale, {"true": lda_w}, cfg.support_tol
        )
        boundaries[name] = {"w": out["w"][0], "b": out["b"][0], "k": out["k"], "test_acc": out["test_acc"][0]}
        log(f"figure3 {name}: w={[round(v, 3) for v in out['w'][0]]} b={out['b'][0]:.3f} k={out['k']}")
    shown = data[0][0]
    return {
        "lda": {"w": lda_w.tolist(), "b": lda_b},
        "boundaries": boundaries,
        "points": {"x": shown.x[: spec.points].tolist(), "y": shown.y[: spec.points].tolist()},
    }


def figure4(cfg: DictConfig, columns_by_label: dict[str, Column], log=print) -> dict:
    task = task_of(cfg.task)
    settings = settings_of(cfg)
    supports = reference_supports(task)
    seeds = [cfg.seed + r for r in range(cfg.repeats)]
    by_ratio = {}
    for ratio in cfg.figure4.negative_ratios:
        if not 0 < ratio < 1:
            raise TopklabError(f"figure4 negative ratio {ratio} must lie in (0, 1)")
        data = make_repeats(task, cfg.sizes, 1.0 - ratio, cfg.repeats, cfg.data_seed)
        row = {}
        for name, column in columns_by_label.items():
            out = evaluate_column(column, cfg.k_grid, data, seeds, settings, cfg.scale, supports, cfg.support_tol)
            row[name] = {
                "k": out["k"],
                "test_acc": out["test_acc"],
                "paraf1": out["paraf1"],
                "paraf1_paper": out["paraf1_paper"],
            }
            log(
                f"figure4 ratio {ratio} {name}: acc {mean_std(out['test_acc'])[0]:.2f}%  "
                f"ParaF1 {mean_std(out['paraf1'])[0]:.3f}"
            )
        by_ratio[str(ratio)] = row
    return {"negative_ratios": list(cfg.figure4.negative_ratios), "by_ratio": by_ratio, "order": list(columns_by_label)}


RUNNERS = {"table2": table2, "figure3": figure3, "figure4": figure4}


def run(cfg: DictConfig, log=print) -> list[Path]:
    """Run ``cfg.experiments`` and write ``<results_dir>/<name>.json`` for each (atomically).

    A stored file there is replaced only under ``force_result`` (the new one records what it replaced).
    Under another config or identity (:mod:`topklab.engine.run_identity`) it is refused in one line
    before anything runs, or under ``check_result`` the run writes into ``check_dir`` and compares with
    it; under an equal one the stored file is kept where the run reproduces it bit for bit, and the
    run's own goes into ``check_dir`` otherwise."""
    unknown = [e for e in cfg.experiments if e not in RUNNERS]
    if unknown:
        raise TopklabError(f"unknown synthetic experiment(s) {unknown}; choose from: {', '.join(EXPERIMENTS)}")
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise TopklabError(f"repeats={cfg.repeats!r} must be an int >= 1")
    columns = {name: columns_of(cfg[name].columns) for name in cfg.experiments}  # every row checked first
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    mine, config = identity(torch.device("cpu"), None), portable_config(cfg)
    force, check = bool(cfg.get("force_result")), bool(cfg.get("check_result"))
    planned = {}
    for name in cfg.experiments:  # every stored file checked before anything runs
        path = Path(cfg.results_dir) / f"{name}{cfg.suffix}.json"
        stored = read_stored(path, force)
        differences = [] if stored is None or force else stored_differences(stored, config, mine)
        if differences and not check:
            raise refusal(path, differences)
        planned[name] = (path, stored, differences)
    provenance = collect(cfg.paths.root_dir)
    written = []
    for name in cfg.experiments:
        path, stored, differences = planned[name]
        start = time.perf_counter()
        payload = RUNNERS[name](cfg, columns[name], log)
        payload["seconds"] = time.perf_counter() - start
        payload["identity"] = mine
        if stored is not None and force:
            payload["replaced"] = replaced_record(stored)
        elif stored is not None:
            compared = compare_with_stored(path, {"result": {"summary": stored.get("result", {})}}, payload)
            payload["compared_with"] = {k: v for k, v in compared.items() if k != "line"}
            log(compared["line"])
            if compared["identical"] and not differences and not check:
                written.append(path)
                continue
            path = Path(cfg.check_dir or ".") / path.name
            log(f"{planned[name][0]} is kept; this run's result is {path} (force_result=true replaces it)")
        result = make_result(
            "synthetic",
            name,
            payload,
            command=" ".join(["python", *sys.argv]),
            config=config,
            provenance=provenance,
        )
        written.append(write_result(path, result))
        log(f"wrote {written[-1]} ({payload['seconds']:.0f} s)")
    return written


def run_protocol(cfg: DictConfig, fields: list[str], settings: list[str]) -> None:
    """Compose configs/reproduce_synthetic.yaml from a runner's ``fields``, the run's seed and paths,
    then ``settings`` (the last word), and :func:`run` it; a setting Hydra cannot apply is one line."""
    paths = [f"paths.{key}={value}" for key, value in OmegaConf.to_container(cfg.paths, resolve=True).items()]
    try:
        setup = compose("reproduce_synthetic", overrides=[*fields, f"seed={cfg.seed}", *paths, *settings])
    except (HydraException, OmegaConfBaseException) as err:
        raise TopklabError(f"runner.settings: {' '.join(str(err).split())}") from None
    run(setup)


SYNTHETIC_OWN_KEYS = (
    "experiment",
    "seed",
    "runner",
    "paths",
    "hydra",
    "logger",
    "force_result",
    "check_result",
)  # what a column honours or ignores harmlessly


@dataclasses.dataclass
class SyntheticColumn:
    """``runner=synthetic_column``: ``python train.py experiment=stk/table2/stk_srelu`` runs that column
    of the synthetic experiment its row's folder names (``table2``, ``figure3``, ``figure4``): its
    aggregate over the repeats, with configs/reproduce_synthetic.yaml's task, data and training
    (training seed ``seed`` + r, data ``data_seed`` + r), and writes ``<run dir>/<experiment>.json``
    with this column alone. The committed file holds every column (:class:`SyntheticExperiment`,
    ``python train.py experiment=stk/synthetic/<experiment>``, ``make reproduce-synthetic``).

    Parameters
    ----------
    repeats : int >= 1
        Repeats, each on fresh data (the paper: 50).
    threads : int >= 0
        torch threads (0: torch's default; 1, as ``make reproduce-synthetic`` runs).
    settings : list of str
        Overrides of configs/reproduce_synthetic.yaml for this column (a trial, e.g.
        ``["trainer.max_epochs=2", "k_grid=[0.5]"]``; on the command line quote each item:
        ``'runner.settings=["trainer.max_epochs=2"]'``); every field not named keeps the paper's setting.

    Examples
    --------
    >>> SyntheticColumn(repeats=2).repeats
    2
    """

    repeats: int = 50
    threads: int = 1
    settings: list[str] = dataclasses.field(default_factory=list)

    @staticmethod
    def experiment_of(row: str | None) -> str | None:
        """The synthetic experiment a column row belongs to: ``table2`` for ``stk/table2/atk``."""
        parts = (row or "").split("/")
        return parts[1] if len(parts) == 3 and parts[0] == "stk" and parts[1] in RUNNERS else None

    def check(self, cfg: DictConfig, overrides: list[str], experiment: str | None = None) -> None:
        """A one-line :class:`TopklabError` for a command line this runner cannot honour: no column
        row, several processes, or an override that would not reach the column (train.py checks
        before Hydra)."""
        if self.experiment_of(experiment) is None:
            raise TopklabError(
                f"runner=synthetic_column runs a column row of {', '.join(EXPERIMENTS)} "
                f"(experiment=stk/table2/<column> ...), not {experiment or 'a run without experiment='}"
            )
        check_one_process_command(
            "synthetic_column",
            overrides,
            SYNTHETIC_OWN_KEYS,
            "does not reach the column: its task, data and training are configs/reproduce_synthetic.yaml's; "
            "set one with 'runner.settings=[\"<field>=<value>\"]'",
        )

    def __call__(self, cfg: DictConfig, run_dir, job_name=None, overrides=None, experiment=None) -> None:
        self.check(cfg, list(overrides or []), experiment)
        fields = [
            f"experiments=[{self.experiment_of(experiment)}]",
            f"{self.experiment_of(experiment)}.columns=[{experiment}]",
            f"results_dir={Path(run_dir)}",
            f"repeats={self.repeats}",
            f"threads={self.threads}",
        ]
        run_protocol(cfg, fields, self.settings)


SYNTHETIC_TRIAL_KEYS = ("runner.repeats", "runner.settings", "runner.experiments")  # change what the file holds


@dataclasses.dataclass
class SyntheticExperiment:
    """``runner=synthetic_experiment``: ``python train.py experiment=stk/synthetic/table2`` runs a whole
    committed file of the synthetic experiments, every column of ``experiments`` over the repeats
    on the same draws, into ``results/synthetic/<experiment><suffix>.json``: what
    ``scripts/reproduce_synthetic.py`` runs with the same fields. A command line that changes
    ``runner.repeats``, ``runner.settings`` or ``runner.experiments`` is a trial: its files go to the
    run's directory, never to ``results/``.

    Parameters
    ----------
    experiments : list of str
        Of ``table2``, ``figure3``, ``figure4`` (the row's).
    settings : list of str
        The row's overrides of configs/reproduce_synthetic.yaml (e.g. ``["scale=atk", "suffix=_scale_atk"]``).
    repeats : int >= 1
        Repeats, each on fresh data (the paper: 50).
    threads : int >= 0
        torch threads (0: torch's default; 1, as the committed files were made).

    Examples
    --------
    >>> SyntheticExperiment(experiments=["table2"], settings=["suffix=_intended"]).settings
    ['suffix=_intended']
    """

    experiments: list[str] = dataclasses.field(default_factory=list)
    settings: list[str] = dataclasses.field(default_factory=list)
    repeats: int = 50
    threads: int = 1

    def check(self, cfg: DictConfig, overrides: list[str], experiment: str | None = None) -> None:
        """A one-line :class:`TopklabError` for a command line this runner cannot honour: a row
        without experiments, several processes, or an override that would not reach the file."""
        if not self.experiments or set(self.experiments) - set(EXPERIMENTS):
            raise TopklabError(
                f"runner=synthetic_experiment runs a row of configs/experiment/stk/synthetic/ "
                f"(runner.experiments of {', '.join(EXPERIMENTS)}), not {experiment or 'a run without experiment='}"
            )
        check_one_process_command(
            "synthetic_experiment",
            overrides,
            SYNTHETIC_OWN_KEYS,
            "does not reach the experiment: its task, data and training are configs/reproduce_synthetic.yaml's; "
            "set one with 'runner.settings=[\"<field>=<value>\"]' (a trial)",
        )

    def __call__(self, cfg: DictConfig, run_dir, job_name=None, overrides=None, experiment=None) -> None:
        overrides = list(overrides or [])
        self.check(cfg, overrides, experiment)
        trial = any(o.lstrip("+~").startswith(SYNTHETIC_TRIAL_KEYS) for o in overrides)
        fields = [f"experiments=[{','.join(self.experiments)}]", f"repeats={self.repeats}", f"threads={self.threads}"]
        stored = [f"force_result={bool(cfg.get('force_result'))}", f"check_result={bool(cfg.get('check_result'))}",
                  f"check_dir={Path(run_dir)}"]  # fmt: skip
        run_protocol(cfg, [*fields, *stored], [*self.settings, *([f"results_dir={Path(run_dir)}"] if trial else [])])
