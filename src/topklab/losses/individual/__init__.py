from topklab.losses.individual.absolute import Absolute
from topklab.losses.individual.cross_entropy import CrossEntropy
from topklab.losses.individual.hinge import Hinge
from topklab.losses.individual.logistic import Logistic
from topklab.losses.individual.square import Square

__all__ = ["Absolute", "CrossEntropy", "Hinge", "Logistic", "Square"]
