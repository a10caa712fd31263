"""One training job from a composed config: build the seams, train with the engine, record.

config → instantiate → Data / Task / Objective / Model → :class:`~topklab.engine.Engine` →
run record (``outputs/``) → portable result (``results/``) → report.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from topklab.config import override_root
from topklab.data.contract import PAGE, check_data
from topklab.data.fingerprint import dataset_fingerprint
from topklab.engine.build import build, build_for_data
from topklab.engine.checkpoint import CheckpointStore, run_key
from topklab.engine.distributed import Distributed
from topklab.engine.interrupt import deferred_signals
from topklab.engine.loop import check_splits
from topklab.engine.objective import Objective, TrainingModule
from topklab.engine.record import RunRecord, SilentRecord
from topklab.engine.result_guard import (
    AUTO,
    chosen_experiment,
    compare_with_stored,
    destination,
    filed_as,
    read_stored,
    refusal,
    replaced_record,
    result_path,
    row_filing,
    stored_differences,
)
from topklab.engine.run_identity import identity
from topklab.loggers import NullLogger
from topklab.losses.aggregate.lambda_monitor import ALL_STEPS
from topklab.report import make_result
from topklab.report import write_result as write_envelope
from topklab.utils.checks import check_int
from topklab.utils.device import resolve_device
from topklab.utils.errors import NonFiniteLossError, TopklabError
from topklab.utils.io import check_writable
from topklab.utils.k import resolve_k
from topklab.utils.provenance import check_cpu_capability, portable_config
from topklab.utils.seed import deterministic_algorithms, seed_everything


def smallest_batch(data, batch_size: int, drop_last: bool) -> int:
    """Per-sample losses in the smallest training batch: the data's own count when it batches by
    something else than rows (tokens, in translation), else the full or the last partial batch."""
    if hasattr(data, "smallest_batch"):
        return data.smallest_batch(batch_size, drop_last)
    n_train = len(data.targets("train"))
    smallest = min(batch_size, n_train)
    if not drop_last and n_train > batch_size and n_train % batch_size:
        smallest = n_train % batch_size
    return smallest


def check_k_fits(aggregate, batch_size: int, smallest: int) -> None:
    """A count k must fit every batch's losses, the smallest batch's included."""
    k = getattr(aggregate, "k", None)
    if k is None:
        return
    try:
        resolve_k(k, smallest)
    except ValueError as err:
        raise TopklabError(
            f"loss.k: {err} (engine.batch_size={batch_size}, smallest batch={smallest} losses); "
            f"use a fraction of the batch or engine.drop_last=true"
        ) from None


def project_root() -> Path:
    return Path(os.environ.get("TOPKLAB_ROOT", ".")).resolve()


def check_run_settings(cfg: DictConfig) -> None:
    """One-line errors for run-wide values that the builders would reject with a traceback: a seed
    that is not a whole number, and an optimizer rate, weight decay or momentum out of range."""
    seed = cfg.seed
    check_int("seed", seed, 0, error=TopklabError)
    optim = cfg.get("optim") or {}
    for key, lowest in (("lr", 0.0), ("weight_decay", 0.0), ("momentum", 0.0)):
        value = optim.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < lowest
            or (key == "lr" and value == 0)
        ):
            bound = "a finite number > 0" if key == "lr" else "a finite number >= 0"
            raise TopklabError(f"optim.{key}={value!r} must be {bound}")


def build_run(cfg: DictConfig):
    """The seams of one run, in the order that fixes the model's initialisation (seed first):
    ``(data, model, objective, task, engine)``."""
    check_run_settings(cfg)
    check_cpu_capability(cfg.get("cpu_capability"))
    seed_everything(cfg.seed)
    data = build(cfg.dataset, "dataset").splits()
    check_data(data, cfg.dataset._target_)
    check_splits(data, ["train", "val", *(cfg.engine.get("final_splits") or ["test"])], cfg.dataset)
    provided = data.provides()
    model = build_for_data(cfg.model, "model", provided)
    if not isinstance(model, torch.nn.Module):
        raise TopklabError(
            f"model {cfg.model._target_} gives a {type(model).__name__}, not a torch.nn.Module; see {PAGE}"
        )
    individual = build_for_data(cfg.individual, "individual", provided)
    aggregate = build(cfg.loss, "loss")
    engine = build(cfg.engine, "engine")
    task = build_for_data(cfg.task, "task", provided)
    try:
        objective = Objective(individual, aggregate, **OmegaConf.to_container(cfg.objective, resolve=True))
    except (TypeError, ValueError) as err:
        raise TopklabError(f"objective: {err}") from None
    check_k_fits(aggregate, engine.batch_size, smallest_batch(data, engine.batch_size, engine.drop_last))
    for metric in engine.select_metrics or []:
        try:
            task.higher_is_better(metric)
        except ValueError as err:
            raise TopklabError(f"engine.select_metrics: {err}") from None
    return data, model, objective, task, engine


def train(
    cfg: DictConfig, run_dir: str | Path, job_name: str | None = None, overrides: list[str] | None = None
) -> dict:
    """Train one model as configured; write the run record to ``run_dir``; return the summary.

    ``overrides``: the command line's overrides (train.py passes them): their ``experiment=`` names
    the row, and they decide whether the result may go to the row's file under results/
    (:mod:`topklab.engine.result_guard`); None writes ``cfg.result_file`` as given (after the same
    check that it replaces nothing different), ``auto`` only for a row whose ``result.row`` is set.

    Raises :class:`TopklabError` (after removing the partial record) on bad input. Under
    ``torchrun`` every rank trains; only the main rank writes the record, logs and the result.
    """
    dist = Distributed.from_env(backend="gloo" if cfg.engine.device == "cpu" else None).init()
    logger = record = None
    try:
        record, fingerprint, planned = open_record(cfg, run_dir, job_name, overrides, dist)
        data, model, objective, task, engine = build_run(cfg)
        module = TrainingModule(model, objective)
        optimizer = build(cfg.optim, "optim")(module.parameter_groups())
        logger = build(cfg.logger, "logger") if dist.is_main else NullLogger()
        seeds = {"seed": cfg.seed, "split_seed": data.info["split_seed"], **_data_seeds(cfg)}
        record.write_start(cfg, seeds, project_root())
        record.write_indices(getattr(data, "indices", {}))
        workdir = Path(cfg.paths.checkpoint_dir) / run_key(cfg)
        resume_id = CheckpointStore(workdir).info().get("logger_id")
        logger.start(record.run_dir, OmegaConf.to_container(cfg, resolve=True), resume_id=resume_id)
        hooks = dict(on_epoch_end=record.add_epoch, on_eval=logger.log, replay_logged=logger.replay)
        with deterministic_algorithms(engine.deterministic), deferred_signals():
            result = engine.fit(module, optimizer, data, task, cfg.seed, **hooks, workdir=workdir,
                                run_dir=record.run_dir, logger_id=logger.id, dist=dist,
                                data_fingerprint=fingerprint)  # fmt: skip
        dist.barrier()  # no rank tears the process group down while another still talks to it (gloo aborts then)
    except NonFiniteLossError as err:
        record.discard(keep=("last_good.pt",))
        path = record.save_state("last_good.pt", err.last_good_state)
        raise NonFiniteLossError(f"{err} (state before that step saved to {path})") from None
    except TopklabError:
        if record is not None:
            record.discard()
        raise
    finally:
        if logger is not None:
            logger.close()
        dist.close()
    summary = run_summary(cfg, data, model, seeds, logger.id, {"data_fingerprint": fingerprint, **result})
    record.write_summary(summary)
    if planned is not None:
        write_result(cfg, summary, record, *planned)
    return summary


def data_fingerprint(cfg: DictConfig) -> str | None:
    """The fingerprint of the files the configured dataset reads (:mod:`topklab.data.fingerprint`;
    None for a dataset that names none): part of the result's and the checkpoint's identity."""
    return dataset_fingerprint(build(cfg.dataset, "dataset"))


def open_record(
    cfg: DictConfig, run_dir, job_name, overrides, dist
) -> tuple[RunRecord, str | None, tuple[Path, dict] | None]:
    """The run's record (Hydra's run directory under train.py; silent on ranks other than the main one),
    the fingerprint of its data (:func:`data_fingerprint`), and where its result goes and what it is
    filed as (:func:`plan_result`), with every folder the run will write checked first."""
    if not dist.is_main:
        return SilentRecord(run_dir, job_name), data_fingerprint(cfg), None
    check_writable([(Path(run_dir), "hydra.run.dir")])
    record = RunRecord(run_dir, job_name)
    try:
        fingerprint = data_fingerprint(cfg)
        planned = plan_result(cfg, overrides, record.run_dir, fingerprint)
        folders = [(Path(cfg.paths.checkpoint_dir), "paths.checkpoint_dir")] if cfg.engine.get("checkpoint") else []
        check_writable([*folders, *([(planned[0].parent, "result_file")] if planned is not None else [])])
    except TopklabError:
        record.discard()
        raise
    return record, fingerprint, planned


def run_summary(cfg: DictConfig, data, model, seeds: dict, logger_id, result: dict) -> dict:
    """The run's summary: what was trained on what, with which seeds, and the engine's result."""
    parameters = list(model.parameters())
    return {
        "dataset": data.name, "task": data.task, "data": data.info, "recipe": cfg.get("recipe"),
        "model": cfg.model._target_, "loss": cfg.loss._target_, "individual": cfg.individual._target_,
        "parameters": {"total": sum(p.numel() for p in parameters),
                       "trainable": sum(p.numel() for p in parameters if p.requires_grad)},
        "seeds": seeds, "logger_id": logger_id, "class_counts": data.info.get("class_counts"),
        "loader": getattr(data, "loader", None), **result,
    }  # fmt: skip


def plan_result(
    cfg: DictConfig, overrides: list[str] | None, run_dir: Path, fingerprint: str | None
) -> tuple[Path, dict, dict] | None:
    """``(path, filing, against)``: where the result will go (said in one line when not where asked),
    the ``{family, table, row}`` it is filed as, and what is stored there, read before training:
    ``{"replaces": what}`` under ``force_result=true``; else ``{"compare": its path, "stored": it}``, the
    run ending by comparing with it (:func:`write_result`); nothing where nothing is stored. Checked
    before training so that a refusal costs nothing: a stored result there with other settings or
    another identity (:func:`~topklab.engine.result_guard.stored_differences`) is refused in one line,
    or under ``check_result=true`` the run writes into its own folder (as it does under
    ``check_result=true`` whatever is stored). None when the run
    writes none: ``result_file=null``, or ``auto`` for a run that is no experiment row. ``auto`` asks for
    the row's own file (:func:`~topklab.engine.result_guard.result_path`). It writes nothing: the guard
    alone, for a composed config."""
    setting = cfg.get("result_file")
    filing = None if setting is None else row_filing(cfg.get("result"), chosen_experiment(overrides))
    if setting is None or (setting == AUTO and filing is None):
        return None
    device = resolve_device(cfg.engine.device)
    asked = result_path(cfg.paths.root_dir, filing, cfg.seed) if setting == AUTO else Path(setting)
    path, note = destination(str(asked), cfg.paths.root_dir, overrides, run_dir, device)
    if note:
        print(note)
    force = bool(cfg.get("force_result"))
    stored = read_stored(path, force)
    against = {}
    if stored is not None and force:
        against = {"replaces": replaced_record(stored)}
    elif stored is not None:
        differences = stored_differences(stored, portable_config(cfg), identity(device, fingerprint))
        if differences and not cfg.get("check_result"):
            raise refusal(path, differences)
        against = {"compare": path, "stored": stored}
        if differences or cfg.get("check_result"):
            path = Path(run_dir) / "result.json"
            reason = f"was stored under other settings ({'; '.join(differences)})" if differences else "is stored"
            print(f"result: {against['compare']} {reason}; this run writes {path} and compares with it")
    return path, filed_as(filing, asked, OmegaConf.select(cfg, "dataset.task"), device), against


@dataclass
class ModelRun:
    """``runner=model``: train one model with the engine (:func:`train`), print its summary and
    return the validation metric a sweeper optimises. What ``python train.py`` does for every
    per-model row and every run that is no row.

    Examples
    --------
    >>> ModelRun()  # train.py: instantiate(cfg.runner)(cfg, run_dir, job_name=..., overrides=...)
    ModelRun()
    """

    def check(self, cfg: DictConfig, overrides: list[str], experiment: str | None = None) -> None:
        """A one-line :class:`TopklabError` for a command line this runner cannot honour (train.py's
        checks call it before Hydra starts)."""
        chosen = [o for o in overrides if override_root(o) == "preset" and not o.startswith("~")]
        if chosen:
            raise TopklabError(
                f"{chosen[0]} sets the tabular protocol of a row's cells (runner=tabular_cells); "
                "this run trains one model (runner=model): drop it"
            )

    def __call__(
        self,
        cfg: DictConfig,
        run_dir: str | Path,
        job_name: str | None = None,
        overrides: list[str] | None = None,
        experiment: str | None = None,
    ) -> float:
        self.check(cfg, overrides or [], experiment)
        summary = train(cfg, run_dir, job_name=job_name, overrides=overrides)
        print(format_summary(summary))
        return optimized_value(cfg, summary)


def optimized_value(cfg: DictConfig, summary: dict) -> float:
    """The validation metric a sweeper optimises: ``optimized_metric`` or the first selection metric."""
    name = cfg.get("optimized_metric") or next(iter(summary["selection"]))
    val = summary["metrics"]["val"]
    if name not in val or not isinstance(val[name], (int, float)):
        choices = ", ".join(k for k, v in val.items() if isinstance(v, (int, float)))
        raise TopklabError(
            f"optimized_metric={name!r} is not a validation metric of this run; choose one of: {choices}"
        )
    return float(val[name])


def write_result(cfg: DictConfig, summary: dict, record: RunRecord, path: Path, filing: dict, against: dict) -> Path:
    """The run's compact, portable result at ``path`` (:func:`plan_result`), filed as ``filing``'s
    family, table and row, labelled ``cfg.row``: the summary, the config without machine paths, the
    provenance and the command, in :mod:`topklab.report.schema`'s envelope, written atomically. A result
    that replaces another records what it replaced (``replaced``). One planned against a stored result
    prints the comparison and records it (``compared_with``); where it would go in the stored one's place
    (an equal identity), that is kept as it is if this run reproduced it bit for bit, and otherwise this
    one goes into the run's folder: nothing stored is rewritten unless ``force_result=true``."""
    table, row = filing["table"], filing["row"]
    portable_summary = {k: v for k, v in summary.items() if k != "logger_id"}  # a CSV logger's id is a path
    payload = {"table": table, "row": row, "label": cfg.get("row") or row, "summary": portable_summary}
    if "replaces" in against:
        payload["replaced"] = against["replaces"]
    if "compare" in against:
        compared = compare_with_stored(against["compare"], against["stored"], portable_summary)
        payload["compared_with"] = {k: v for k, v in compared.items() if k != "line"}
        print(compared["line"])
        if path == against["compare"]:
            if compared["identical"]:
                return path
            path = record.run_dir / "result.json"
            print(f"result: {against['compare']} is kept; this run's result is {path} (force_result=true replaces)")
    command = "python " + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
    return write_envelope(
        path,
        make_result(
            filing["family"],
            f"{table}/{row}",
            payload,
            command=command,
            config=portable_config(cfg),
            provenance=record.provenance(),
        ),
    )


def _data_seeds(cfg: DictConfig) -> dict:
    source_seed = OmegaConf.select(cfg, "dataset.source.seed")
    return {} if source_seed is None else {"data_generation_seed": source_seed}


def format_summary(summary: dict) -> str:
    metrics = summary["metrics"]
    name = next(iter(summary["selection"]))
    lam = summary["lambda"]
    splits = " | ".join(
        f"{split} {name} {metrics[split][name]:.4f}" for split in ("test", "val", "train") if split in metrics
    )
    return (
        f"{summary['dataset']} | {summary['loss'].rsplit('.', 1)[-1]} + {summary['individual'].rsplit('.', 1)[-1]}"
        f" | {splits}"
        f" | lambda {'n/a' if lam is None else f'{lam:.4f}'}"
        f" | best step {summary['best_step']} of {summary['steps']} ({summary['epochs']} epochs,"
        f" {summary['train_seconds']:.1f}s)"
        f"{lambda_tracking_line(summary.get('lambda_tracking'))}"
    )


def lambda_tracking_line(tracking: dict | None) -> str:
    """`` | λ in band 0.98`` for a MATk/STk run, with " on all steps" when the run stopped within its
    burn-in and its flag when λ did not track or partly tracked; empty otherwise.

    Examples
    --------
    >>> lambda_tracking_line({"in_band": 0.984, "flag": None})
    ' | λ in band 0.98'
    >>> lambda_tracking_line({"in_band": 0.6, "judged_on": "all steps", "flag": "λ partly tracked the k-th loss"})
    ' | λ in band 0.60 on all steps (λ partly tracked the k-th loss)'
    """
    if not tracking or tracking.get("in_band") is None:
        return ""
    scope = f" on {ALL_STEPS}" if tracking.get("judged_on") == ALL_STEPS else ""
    flag = f" ({tracking['flag']})" if tracking.get("flag") else ""
    return f" | λ in band {tracking['in_band']:.2f}{scope}{flag}"
