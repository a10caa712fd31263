"""Metric sinks selected by ``logger=none|csv|wandb``. Each has ``start(run_dir, config)``,
``log(row)``, ``close()`` and an ``id`` (kept so a resumed run continues the same logger run)."""

from topklab.loggers.csv import CSVLogger
from topklab.loggers.none import NullLogger
from topklab.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "NullLogger", "WandbLogger"]
