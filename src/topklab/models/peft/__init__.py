"""Parameter-efficient fine-tuning of a frozen ViT (PEL/LIFT): tuners and the model."""

from topklab.models.peft.text_head import TextHead
from topklab.models.peft.tuners import VPT, AdaptFormer, BiasOnly, FullFineTuning, LinearProbe, LoRA, default_rank
from topklab.models.peft.vit import ClassMeanHead, CosineClassifier, PeftViT

__all__ = [
    "AdaptFormer",
    "BiasOnly",
    "ClassMeanHead",
    "CosineClassifier",
    "FullFineTuning",
    "LinearProbe",
    "LoRA",
    "PeftViT",
    "TextHead",
    "VPT",
    "default_rank",
]
