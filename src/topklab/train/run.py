"""One training job from a composed config: build, train, record. Used by ``train.py``."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from topklab.losses.k import resolve_k
from topklab.train.record import RunRecord
from topklab.train.tabular import trainable_parameters
from topklab.utils.errors import NonFiniteLossError, TopklabError
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


def check_k_fits(aggregate, batch_size: int, n_train: int) -> None:
    k = getattr(aggregate, "k", None)
    if k is None:
        return
    try:
        resolve_k(k, min(batch_size, n_train))
    except ValueError as err:
        raise TopklabError(f"loss.k: {err} (trainer.batch_size={batch_size}, training rows={n_train})") from None


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
        model = build(cfg.model, "model", in_features=splits.n_features)
        individual = build(cfg.individual, "individual")
        aggregate = build(cfg.loss, "loss")
        trainer = build(cfg.trainer, "trainer")
        check_k_fits(aggregate, trainer.batch_size, len(splits.y_train))
        optimizer = build(cfg.optim, "optim")(trainable_parameters(model, aggregate))
        logger = build(cfg.logger, "logger")
        seeds = {"seed": cfg.seed, "split_seed": splits.info["split_seed"], **_data_seeds(cfg)}
        record.write_start(cfg, seeds, project_root())
        logger.start(record.run_dir, OmegaConf.to_container(cfg, resolve=True))
        generator = torch.Generator().manual_seed(cfg.seed)
        result = trainer.fit(
            model, individual, aggregate, optimizer, splits, generator,
            on_epoch_end=record.add_epoch,
            on_eval=logger.log,
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
    return summary


def _data_seeds(cfg: DictConfig) -> dict:
    source_seed = OmegaConf.select(cfg, "dataset.source.seed")
    return {} if source_seed is None else {"data_generation_seed": source_seed}


def format_summary(summary: dict) -> str:
    metrics = summary["metrics"]
    name = next(k for k in metrics["test"] if k != "score")
    lam = summary["lambda"]
    return (
        f"{summary['dataset']} | {summary['loss'].rsplit('.', 1)[-1]} + {summary['individual'].rsplit('.', 1)[-1]}"
        f" | test {name} {metrics['test'][name]:.4f} | val {name} {metrics['val'][name]:.4f}"
        f" | train {name} {metrics['train'][name]:.4f}"
        f" | lambda {'n/a' if lam is None else f'{lam:.4f}'}"
        f" | best step {summary['best_step']} of {summary['steps']} ({summary['epochs']} epochs,"
        f" {summary['train_seconds']:.1f}s)"
    )
