from topklab.losses.individual.absolute import Absolute
from topklab.losses.individual.cost_sensitive import CostSensitiveCE
from topklab.losses.individual.cross_entropy import CrossEntropy
from topklab.losses.individual.hinge import Hinge
from topklab.losses.individual.label_smoothed_ce import LabelSmoothedCrossEntropy
from topklab.losses.individual.logistic import Logistic
from topklab.losses.individual.logit_adjusted import LogitAdjusted
from topklab.losses.individual.noised_topk_hinge import ImbalancedNoisedTopKHinge, NoisedTopKHinge
from topklab.losses.individual.smooth_topk_svm import SmoothTopKSVM
from topklab.losses.individual.square import Square
from topklab.losses.individual.topk_ce import TopKCrossEntropy

__all__ = [
    "Absolute",
    "CostSensitiveCE",
    "CrossEntropy",
    "Hinge",
    "ImbalancedNoisedTopKHinge",
    "LabelSmoothedCrossEntropy",
    "Logistic",
    "LogitAdjusted",
    "NoisedTopKHinge",
    "SmoothTopKSVM",
    "Square",
    "TopKCrossEntropy",
]
