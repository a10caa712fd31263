"""A frozen timm ViT with a parameter-efficient branch and a cosine classifier: PEL/LIFT's model
(Shi et al. 2024) on the 768-d class token after the final norm."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from topklab.models.peft.tuners import LinearProbe
from topklab.utils.errors import DataUnavailableError


class CosineClassifier(nn.Module):
    """``logits = scale · ⟨x/‖x‖, w_c/‖w_c‖⟩``, no bias (PEL/LIFT: scale 25).

    Parameters
    ----------
    in_features, num_classes : int; scale : float > 0, the inverse temperature of the logits

    Examples
    --------
    >>> head = CosineClassifier(4, 3, scale=25.0)
    >>> logits = head(torch.randn(2, 4))
    >>> bool((logits.abs() <= 25.0 + 1e-4).all())
    True
    """

    def __init__(self, in_features: int, num_classes: int, scale: float = 25.0):
        super().__init__()
        if not scale > 0:
            raise ValueError(f"model.scale={scale} must be > 0")
        self.scale = scale
        self.weight = nn.Parameter(F.normalize(torch.empty(num_classes, in_features).uniform_(-1, 1), dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.linear(F.normalize(x, dim=-1), F.normalize(self.weight, dim=-1))


def weights_cache() -> str:
    return os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")


class PeftViT(nn.Module):
    """A timm ViT, frozen, with a tuner's branch (``model.tuner``) and a cosine classifier.

    Parameters
    ----------
    num_classes : int (given by the data)
    backbone : timm model name with its pre-training tag, e.g. ``vit_base_patch16_224.augreg_in21k_ft_in1k``
        (the "IN21K" ViT-B/16 of PEL/LIFT's timm), ``vit_base_patch16_clip_quickgelu_224.openai``,
        ``vit_base_patch16_224.mae``
    pretrained : bool, load the tag's weights from the Hugging Face cache (offline: a one-line error
        naming the weights and the cache when they are not there)
    tuner : one of :mod:`topklab.models.peft.tuners` (AdaptFormer, LoRA, VPT, BiasOnly, LinearProbe,
        FullFineTuning); None is a linear (cosine) probe
    scale : float > 0, the cosine classifier's scale (25)
    img_size : int, input side (224; tests use smaller)
    head_init : :class:`~topklab.models.peft.text_head.TextHead` (the head starts as CLIP's
        zero-shot classifier of the class names) or None (random unit rows)
    class_names : the classes' names (given by the data), needed by head_init

    Examples
    --------
    >>> from topklab.models.peft.tuners import AdaptFormer
    >>> model = PeftViT(10, backbone="vit_tiny_patch16_224", tuner=AdaptFormer(rank=2), img_size=32)
    >>> model(torch.randn(2, 3, 32, 32)).shape, model.trainable_parameters
    (torch.Size([2, 10]), 18084)
    """

    def __init__(self, num_classes: int, backbone: str = "vit_base_patch16_224.augreg_in21k_ft_in1k",
                 pretrained: bool = False, tuner=None, scale: float = 25.0, img_size: int = 224, head_init=None,
                 class_names: list[str] | None = None):
        super().__init__()
        import timm

        import topklab.compat  # noqa: F401  (timm imports torchvision)

        try:
            vit = timm.create_model(backbone, pretrained=pretrained, num_classes=0, img_size=img_size)
        except RuntimeError as err:
            if "Unknown model" in str(err):
                raise ValueError(f"model.backbone={backbone!r} is not a timm model ({err})") from None
            raise
        except (OSError, ValueError) as err:  # no network and nothing cached
            raise DataUnavailableError(
                f"pretrained weights of {backbone} are not in the Hugging Face cache {weights_cache()} "
                f"({type(err).__name__}); download them where a network exists (timm.create_model('{backbone}', "
                f"pretrained=True)) and copy the cache here, or set model.pretrained=false") from None
        for p in vit.parameters():
            p.requires_grad_(False)
        self.trained = (tuner or LinearProbe()).attach(vit, num_classes)
        for p in self.trained:
            p.requires_grad_(True)
        self.vit, self.backbone = vit, backbone
        self.head = CosineClassifier(vit.num_features, num_classes, scale)
        if head_init is not None:
            if class_names is None or len(class_names) != num_classes:
                raise ValueError(f"model.head_init needs the {num_classes} class names, and this dataset gives "
                                 f"{'none' if class_names is None else len(class_names)}; set model.head_init=null")
            with torch.no_grad():
                self.head.weight.copy_(head_init(list(class_names), vit.num_features))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The class token after the final norm (D = 768 for ViT-B)."""
        return self.vit.forward_features(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def parameter_groups(self) -> list[dict]:
        """The branch's and the head's parameters; the frozen backbone is not given to the optimizer."""
        return [{"params": [*self.trained, *self.head.parameters()]}]

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.trained) + sum(p.numel() for p in self.head.parameters())
