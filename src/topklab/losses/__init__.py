"""Losses: individual (per-sample, no reduction) and aggregate (losses (..., n) -> one value per row).

>>> import torch
>>> from topklab.losses import STk, Logistic
>>> per_sample = Logistic()(torch.randn(16), torch.ones(16))
>>> STk(k=0.9)(per_sample).shape
torch.Size([])
"""

from topklab.losses.aggregate import (
    Aggregate,
    AggregateInputError,
    ATk,
    Average,
    MATk,
    Maximum,
    SoftATk,
    STk,
    ThresholdedTopK,
)
from topklab.losses.individual import (
    Absolute,
    CostSensitiveCE,
    CrossEntropy,
    Hinge,
    ImbalancedNoisedTopKHinge,
    LabelSmoothedCrossEntropy,
    Logistic,
    LogitAdjusted,
    NoisedTopKHinge,
    SmoothTopKSVM,
    Square,
    TopKCrossEntropy,
)
from topklab.smoothing import srelu

__all__ = [
    "ATk",
    "Absolute",
    "Aggregate",
    "AggregateInputError",
    "Average",
    "CostSensitiveCE",
    "CrossEntropy",
    "Hinge",
    "ImbalancedNoisedTopKHinge",
    "LabelSmoothedCrossEntropy",
    "Logistic",
    "LogitAdjusted",
    "MATk",
    "Maximum",
    "NoisedTopKHinge",
    "STk",
    "SmoothTopKSVM",
    "SoftATk",
    "Square",
    "ThresholdedTopK",
    "TopKCrossEntropy",
    "srelu",
]
