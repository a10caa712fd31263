from topklab.models.linear import Linear
from topklab.models.mlp import MLP
from topklab.models.resnet_cifar import CifarResNet, resnet18_cifar, resnet32

__all__ = ["CifarResNet", "Linear", "MLP", "resnet18_cifar", "resnet32"]
