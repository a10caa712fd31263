"""The losses a synthetic column trains on at one k, recorded call by call (repeat 0), with the λ
each call used (:mod:`topklab.losses.aggregate.loss_stream`): whether Table 2's paper update kept λ in band."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from topklab.losses.aggregate.loss_stream import LossStream, record_calls
from topklab.synthetic.experiment import make_repeats, settings_of, task_of
from topklab.synthetic.train import Column, train_logistic


def record_column(cfg: DictConfig, column: Column, k: float) -> LossStream:
    """Train ``column`` (from :func:`~topklab.synthetic.experiment.columns_of`) at ``k`` on repeat 0 of
    ``cfg`` (configs/reproduce_synthetic.yaml) with its trainer settings, recording member 0's calls."""
    settings = dataclasses.replace(settings_of(cfg), **column.trainer)
    train, val, _ = make_repeats(task_of(cfg.task), cfg.sizes, cfg.positive_fraction, 1, cfg.data_seed)
    stream = LossStream(
        source={
            "column": column.aggregate,
            "overrides": dict(column.overrides),
            "optimizer": "adam",
            "setting": {
                "k": k,
                "lr": settings.lr,
                "delta": settings.delta,
                "lam_init": settings.lam_init,
                "batch_size": settings.batch_size,
            },
        }
    )
    aggregate = record_calls(column.module(cfg.scale), stream)

    class Recorded(type(column)):
        def module(self, scale):
            return aggregate

    recorded = Recorded(**{f.name: getattr(column, f.name) for f in dataclasses.fields(column)})
    train_logistic(recorded, settings, train, val, [cfg.seed], [k], scale=cfg.scale)
    return stream
