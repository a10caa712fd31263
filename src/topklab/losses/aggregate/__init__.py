from topklab.losses.aggregate.atk import ATk
from topklab.losses.aggregate.average import Average
from topklab.losses.aggregate.base import Aggregate, AggregateInputError
from topklab.losses.aggregate.matk import MATk
from topklab.losses.aggregate.maximum import Maximum
from topklab.losses.aggregate.soft_atk import SoftATk
from topklab.losses.aggregate.stk import STk
from topklab.losses.aggregate.thresholded import ThresholdedTopK

__all__ = ["ATk", "Aggregate", "AggregateInputError", "Average", "MATk", "Maximum", "STk", "SoftATk", "ThresholdedTopK"]
