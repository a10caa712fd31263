"""A frozen timm ViT with a parameter-efficient branch and a cosine classifier: PEL/LIFT's model
(Shi et al. 2024) on the 768-d class token after the final norm."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from topklab.models.peft.tuners import LinearProbe
from topklab.utils.errors import DataUnavailableError, TopklabError


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


class ClassMeanHead:
    """The cosine head's rows start as the L2-normalised mean feature of each class's training images
    (PEL/LIFT's init for backbones without a text tower: IN21K, MAE). The features are the model's at
    step 0: the backbone's for AdaptFormer, LoRA, bias-only and linear probes (LIFT takes the backbone
    alone; with VPT the initial prompts take part here).

    Parameters
    ----------
    batch_size : int >= 1, images per feature batch
    """

    def __init__(self, batch_size: int = 128):
        if batch_size < 1:
            raise ValueError(f"model.head_init.batch_size={batch_size} must be >= 1")
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, features, loader, num_classes: int) -> torch.Tensor:
        sums, counts = None, torch.zeros(num_classes, dtype=torch.float64)
        for x, y in loader.batches():
            f = features(x).double()
            sums = torch.zeros(num_classes, f.shape[1], dtype=torch.float64, device=f.device) if sums is None else sums
            sums.index_add_(0, y.to(f.device), f)
            counts += torch.bincount(y.cpu(), minlength=num_classes).double()
        if bool((counts == 0).any()):
            raise TopklabError(
                f"model.head_init=class_mean: class(es) {(counts == 0).nonzero().flatten().tolist()[:5]} "
                f"have no training image"
            )
        return F.normalize((sums / counts.to(sums.device)[:, None]).float(), dim=-1)


def weights_cache() -> str:
    return os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
    )


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
        zero-shot classifier of the class names), :class:`ClassMeanHead` (the normalised mean
        feature of each class's training images, computed by the engine before the first step) or
        None (random unit rows)
    class_names : the classes' names (given by the data), needed by head_init

    Examples
    --------
    >>> from topklab.models.peft.tuners import AdaptFormer
    >>> model = PeftViT(10, backbone="vit_tiny_patch16_224", tuner=AdaptFormer(rank=2), img_size=32)
    >>> model(torch.randn(2, 3, 32, 32)).shape, model.trainable_parameters
    (torch.Size([2, 10]), 18084)
    """

    def __init__(
        self,
        num_classes: int,
        backbone: str = "vit_base_patch16_224.augreg_in21k_ft_in1k",
        pretrained: bool = False,
        tuner=None,
        scale: float = 25.0,
        img_size: int = 224,
        head_init=None,
        class_names: list[str] | None = None,
    ):
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
                f"pretrained=True)) and copy the cache here, or set model.pretrained=false"
            ) from None
        for p in vit.parameters():
            p.requires_grad_(False)
        self.trained = (tuner or LinearProbe()).attach(vit, num_classes)
        for p in self.trained:
            p.requires_grad_(True)
        self.vit, self.backbone = vit, backbone
        self.head = CosineClassifier(vit.num_features, num_classes, scale)
        self.head_from_data = head_init if isinstance(head_init, ClassMeanHead) else None
        if head_init is not None and self.head_from_data is None:
            if class_names is None or len(class_names) != num_classes:
                raise ValueError(
                    f"model.head_init needs the {num_classes} class names, and this dataset gives "
                    f"{'none' if class_names is None else len(class_names)}; set model.head_init=null"
                )
            with torch.no_grad():
                self.head.weight.copy_(head_init(list(class_names), vit.num_features))

    def initialise_from_data(self, data, device) -> None:
        """Set the head from class means of the training features (a :class:`ClassMeanHead`); the
        engine calls this once, before the first step of a fresh run."""
        if self.head_from_data is None:
            return
        if not hasattr(data, "feature_loader"):
            raise TopklabError(
                f"model.head_init=class_mean needs training images in one plain crop, which dataset "
                f"{getattr(data, 'name', '?')} does not give; use head_init=null or a listed dataset"
            )
        self.head.weight.copy_(
            self.head_from_data(
                self.features, data.feature_loader(self.head_from_data.batch_size, device), self.head.weight.shape[0]
            )
        )

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
