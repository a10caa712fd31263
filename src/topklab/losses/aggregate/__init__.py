from topklab.losses.aggregate.atk import ATk
from topklab.losses.aggregate.average import Average
from topklab.losses.aggregate.maximum import Maximum
from topklab.losses.aggregate.thresholded import MATk, STk, ThresholdedTopK

__all__ = ["ATk", "Average", "MATk", "Maximum", "STk", "ThresholdedTopK"]
