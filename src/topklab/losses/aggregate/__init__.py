from topklab.losses.aggregate.atk import ATk
from topklab.losses.aggregate.average import Average
from topklab.losses.aggregate.base import Aggregate
from topklab.losses.aggregate.maximum import Maximum
from topklab.losses.aggregate.soft_atk import SoftATk
from topklab.losses.aggregate.registry import aggregate_class, aggregate_names, build_aggregate, build_paper_update_aggregate
from topklab.losses.aggregate.thresholded import MATk, STk, ThresholdedTopK

__all__ = ["ATk", "Aggregate", "Average", "MATk", "Maximum", "STk", "SoftATk", "ThresholdedTopK", "aggregate_class",
           "aggregate_names", "build_aggregate", "build_paper_update_aggregate"]
