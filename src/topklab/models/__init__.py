from topklab.models.embedding_head import EmbeddingHead
from topklab.models.language_model import TransformerLM
from topklab.models.linear import Linear
from topklab.models.mlp import MLP
from topklab.models.resnet_cifar import CifarResNet, resnet18_cifar, resnet32
from topklab.models.routing import ProbabilityThresholdRouter, STkThresholdRouter, TopKRouter
from topklab.models.transformer import Transformer

__all__ = [
    "CifarResNet",
    "EmbeddingHead",
    "Linear",
    "MLP",
    "ProbabilityThresholdRouter",
    "STkThresholdRouter",
    "TopKRouter",
    "Transformer",
    "TransformerLM",
    "resnet18_cifar",
    "resnet32",
]
