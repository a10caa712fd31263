from topklab.models.linear import Linear
from topklab.models.mlp import MLP

__all__ = ["Linear", "MLP"]
