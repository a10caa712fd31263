from topklab.models.linear import Linear
from topklab.models.mlp import MLP
from topklab.models.resnet_cifar import CifarResNet, resnet18_cifar, resnet32
from topklab.models.transformer import Transformer

__all__ = ["CifarResNet", "Linear", "MLP", "Transformer", "resnet18_cifar", "resnet32"]
