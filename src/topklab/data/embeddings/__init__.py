"""Penultimate-layer embeddings of frozen backbones (Petersen et al.'s ImageNet fine-tuning):
extraction into memory-mapped arrays, and a dataset that serves them to the engine."""

from topklab.data.embeddings.backbone import Backbone
from topklab.data.embeddings.dataset import EmbeddingDataset, EmbeddingSplits

__all__ = ["Backbone", "EmbeddingDataset", "EmbeddingSplits"]
