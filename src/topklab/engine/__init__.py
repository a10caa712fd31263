"""One engine for every task: the per-model loop (:class:`Engine`), the training objective
(:class:`Objective`), and the shared best-by-validation tracker (:class:`EarlyStopping`)."""

from topklab.engine.loop import Engine
from topklab.engine.objective import Objective, TrainingModule
from topklab.engine.stopping import EarlyStopping

__all__ = ["EarlyStopping", "Engine", "Objective", "TrainingModule"]
