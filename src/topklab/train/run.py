"""One training job from a composed config: build, train, record. Used by ``train.py``."""
from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from topklab.losses.k import resolve_k
from topklab.train.checkpoint import CheckpointStore, run_key
from topklab.train.record import RunRecord
from topklab.utils.errors import NonFiniteLossError, TopklabError
from topklab.utils.io import atomic_write_json
from topklab.utils.provenance import portable_config
from topklab.utils.seed import seed_everything


def build(node: DictConfig, group: str, **kwargs):
    """``instantiate`` that turns a constructor's ValueError/TypeError into a one-line
    :class:`TopklabError` naming the config group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, TopklabError):
            raise cause
        if isinstance(cause, (ValueError, TypeError)):
            raise TopklabError(f"{group}: {cause}") from None
        raise


DATA_CONTEXT_KEYS = ("in_features", "in_channels", "num_classes", "class_counts")  # what splits.*_context() give


def data_context(node: DictConfig, context: dict) -> dict:
    """The entries of ``context`` (what the data says: in_features, num_classes, class_counts ...)
    that the node's ``_target_`` accepts and the config does not set itself."""
    try:
        parameters = inspect.signature(get_object(node._target_)).parameters
    except (ImportError, ValueError, TypeError, AttributeError):
        return {}
    return {k: v for k, v in context.items() if k in parameters and k not in node}


def build_for_data(node: DictConfig, group: str, context: dict):
    """:func:`build` with the data-dependent arguments the target asks for; a target that needs
    one the dataset cannot give (an MLP on images) gets a one-line error naming both."""
    try:
        return build(node, group, **data_context(node, context))
    except TopklabError as err:
        if "missing" in str(err) and "required" in str(err):
            raise TopklabError(f"{group} {node._target_.rsplit('.', 1)[-1]} does not fit this dataset "
                               f"(it provides {', '.join(context) or 'nothing'}): {err}") from None
        raise


def parameter_groups(model, aggregate) -> list[dict]:
    """The model's parameters, and the aggregate's own (λ of MATk/STk) without weight decay."""
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    threshold = [p for p in aggregate.parameters() if p.requires_grad]
    if threshold:
        groups.append({"params": threshold, "weight_decay": 0.0})
    return groups


def check_k_fits(aggregate, batch_size: int, n_train: int, drop_last: bool = True) -> None:
    """A count k must fit every batch: the full one and, unless it is dropped, the last partial one."""
    k = getattr(aggregate, "k", None)
    if k is None:
        return
    smallest = min(batch_size, n_train)
    if not drop_last and n_train > batch_size and n_train % batch_size:
        smallest = n_train % batch_size
    try:
        resolve_k(k, smallest)
    except ValueError as err:
        raise TopklabError(
            f"loss.k: {err} (trainer.batch_size={batch_size}, training rows={n_train}, smallest batch={smallest}); "
            f"use a fraction of the batch or trainer.drop_last=true") from None


def project_root() -> Path:
    return Path(os.environ.get("TOPKLAB_ROOT", ".")).resolve()


def train(cfg: DictConfig, run_dir: str | Path, job_name: str | None = None) -> dict:
    """Train one model as configured; write the run record to ``run_dir``; return the summary.

    Raises :class:`TopklabError` (after removing the partial record) on bad input.
    """
    record = RunRecord(run_dir, job_name)
    logger = None
    try:
        seed_everything(cfg.seed)
        dataset = build(cfg.dataset, "dataset")
        splits = dataset.splits()
        model = build_for_data(cfg.model, "model", splits.model_context())
        individual = build_for_data(cfg.individual, "individual", splits.loss_context())
        aggregate = build(cfg.loss, "loss")
        trainer = build(cfg.trainer, "trainer")
        check_k_fits(aggregate, trainer.batch_size, len(splits.y_train), trainer.drop_last)
        optimizer = build(cfg.optim, "optim")(parameter_groups(model, aggregate))
        logger = build(cfg.logger, "logger")
        seeds = {"seed": cfg.seed, "split_seed": splits.info["split_seed"], **_data_seeds(cfg)}
        record.write_start(cfg, seeds, project_root())
        record.write_indices(getattr(splits, "indices", {}))
        workdir = Path(cfg.paths.checkpoint_dir) / run_key(cfg)
        logger.start(record.run_dir, OmegaConf.to_container(cfg, resolve=True),
                     resume_id=CheckpointStore(workdir).info().get("logger_id"))
        generator = torch.Generator().manual_seed(cfg.seed)
        result = trainer.fit(
            model, individual, aggregate, optimizer, splits, generator,
            on_epoch_end=record.add_epoch,
            on_eval=logger.log,
            workdir=workdir,
            run_dir=record.run_dir,
            logger_id=logger.id,
        )
    except NonFiniteLossError as err:
        record.discard(keep=("last_good.pt",))
        path = record.save_state("last_good.pt", err.last_good_state)
        raise NonFiniteLossError(f"{err} (state before that step saved to {path})") from None
    except TopklabError:
        record.discard()
        raise
    finally:
        if logger is not None:
            logger.close()
    summary = {
        "dataset": splits.name, "task": splits.task, "data": splits.info,
        "model": cfg.model._target_, "loss": cfg.loss._target_, "individual": cfg.individual._target_,
        "seeds": seeds, "logger_id": logger.id, **result,
    }
    record.write_summary(summary)
    if cfg.get("result_file"):
        write_result(cfg, summary, record)
    return summary


def write_result(cfg: DictConfig, summary: dict, record: RunRecord) -> Path:
    """The run's compact, portable result (summary, config without machine paths, provenance and
    the command) at ``cfg.result_file``, written atomically; what results tables are made from."""
    portable_summary = {k: v for k, v in summary.items() if k != "logger_id"}  # a CSV logger's id is a path
    return atomic_write_json(cfg.result_file, {
        "command": "python " + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv)),
        "config": portable_config(cfg), "summary": portable_summary, "provenance": record.provenance(),
    })


def _data_seeds(cfg: DictConfig) -> dict:
    source_seed = OmegaConf.select(cfg, "dataset.source.seed")
    return {} if source_seed is None else {"data_generation_seed": source_seed}


def format_summary(summary: dict) -> str:
    metrics = summary["metrics"]
    name = next(k for k in metrics["test"] if k != "score")
    lam = summary["lambda"]
    splits = " | ".join(f"{split} {name} {metrics[split][name]:.4f}" for split in ("test", "val", "train") if split in metrics)
    return (
        f"{summary['dataset']} | {summary['loss'].rsplit('.', 1)[-1]} + {summary['individual'].rsplit('.', 1)[-1]}"
        f" | {splits}"
        f" | lambda {'n/a' if lam is None else f'{lam:.4f}'}"
        f" | best step {summary['best_step']} of {summary['steps']} ({summary['epochs']} epochs,"
        f" {summary['train_seconds']:.1f}s)"
    )
