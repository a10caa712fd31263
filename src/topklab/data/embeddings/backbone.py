"""A frozen timm backbone that maps images to penultimate-layer (pooled) embeddings, with the
preprocessing it was trained at, for :mod:`topklab.data.embeddings.extract`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from topklab.data.embeddings.store import STORAGE_DTYPES
from topklab.utils.checks import check_int
from topklab.utils.errors import DataUnavailableError

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
INTERPOLATIONS = ("bilinear", "bicubic")


class Backbone:
    """A timm model without its classifier (``num_classes=0``: the pooled features).

    Parameters
    ----------
    name : timm model name, e.g. ``resnext101_32x48d.fb_wsl_ig1b_ft_in1k`` (ResNeXt-101 32x48d WSL,
        registered by :mod:`topklab.models.wsl_resnext`) or ``tf_efficientnet_l2.ns_jft_in1k``
    resolution : int >= 1, the square input size (difftopk: 320 for ImageNet-1K and 224 for 21K-P with
        the ResNeXt; 800 for EfficientNet-L2)
    interpolation : bilinear | bicubic, or None for the pretrained config's
    crop_pct : float in (0, 1] or None (the pretrained config's): resize the short side to
        resolution / crop_pct, then centre-crop the resolution
    precision : fp32 | fp16 | bf16, the dtype the forward pass runs in (autocast)
    storage : float16 | float32, the dtype of the stored embeddings
    pretrained : bool, load the pretrained weights (from ``checkpoint``, else timm's hub cache; offline,
        missing weights are a one-line error); false: random weights (tests, timing)
    checkpoint : path or None, a local weights file (e.g. Facebook's ``ig_resnext101_32x48-3e41cc8a.pth``)
    out_name : the folder name the extraction writes under (configs: the backbone and resolution)

    Examples
    --------
    >>> backbone = Backbone("test_efficientnet", resolution=32, pretrained=False)
    >>> backbone.model(torch.device("cpu"))(torch.zeros(1, 3, 32, 32)).shape
    torch.Size([1, 256])
    """

    def __init__(
        self,
        name: str,
        resolution: int,
        interpolation: str | None = None,
        crop_pct: float | None = None,
        precision: str = "fp32",
        storage: str = "float16",
        pretrained: bool = True,
        checkpoint: str | None = None,
        out_name: str | None = None,
    ):
        import timm

        import topklab.models.wsl_resnext  # noqa: F401  (registers resnext101_32x48d with timm)

        if not timm.is_model(name):
            raise ValueError(f"backbone.name={name!r} is not a timm model (see timm.list_models())")
        check_int("backbone.resolution", resolution)
        if interpolation is not None and interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"backbone.interpolation={interpolation!r}; choose one of {', '.join(INTERPOLATIONS)} or null"
            )
        if crop_pct is not None and not 0 < crop_pct <= 1:
            raise ValueError(f"backbone.crop_pct={crop_pct} must lie in (0, 1], or be null for the model's own")
        if precision not in PRECISIONS:
            raise ValueError(f"backbone.precision={precision!r}; choose one of {', '.join(PRECISIONS)}")
        if storage not in STORAGE_DTYPES:
            raise ValueError(f"backbone.storage={storage!r}; choose one of {', '.join(STORAGE_DTYPES)}")
        self.name, self.resolution, self.interpolation, self.crop_pct = name, resolution, interpolation, crop_pct
        self.precision, self.storage, self.pretrained = precision, storage, pretrained
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.out_name = out_name or f"{name.replace('/', '_')}_{resolution}"

    def model(self, device: torch.device) -> torch.nn.Module:
        """The backbone in eval mode on ``device``; missing or unreadable weights are a one-line error."""
        import timm

        overlay = None
        if self.pretrained and self.checkpoint is not None:
            if not self.checkpoint.is_file():
                raise DataUnavailableError(
                    f"backbone.checkpoint={self.checkpoint} does not exist; give the path of {self.name}'s weights file"
                )
            overlay = {"file": str(self.checkpoint)}
        try:
            model = timm.create_model(
                self.name, pretrained=self.pretrained, num_classes=0, pretrained_cfg_overlay=overlay
            )
        except (RuntimeError, OSError, ValueError, KeyError) as err:
            if not self.pretrained:
                raise
            where = (
                f"from {self.checkpoint}"
                if self.checkpoint
                else "(not in the local Hugging Face / torch hub cache, and offline)"
            )
            first_line = (str(err).strip().splitlines() or [""])[0][:160]
            raise DataUnavailableError(
                f"backbone {self.name}: its pretrained weights could not be loaded {where}: {type(err).__name__}: "
                f"{first_line}; download them on a machine with internet (timm caches them) or pass "
                f"backbone.checkpoint=/path/to/weights"
            ) from None
        return model.eval().to(device)

    def transform(self, model: torch.nn.Module):
        """timm's evaluation transform at ``resolution`` (resize, centre crop, normalise)."""
        from timm.data import create_transform, resolve_data_config

        args = {"input_size": (3, self.resolution, self.resolution)}
        if self.interpolation is not None:
            args["interpolation"] = self.interpolation
        if self.crop_pct is not None:
            args["crop_pct"] = self.crop_pct
        return create_transform(**resolve_data_config(args, model=model), is_training=False)

    def autocast(self, device: torch.device):
        dtype = PRECISIONS[self.precision]
        return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)

    def describe(self, model: torch.nn.Module) -> dict:
        """What the embeddings depend on: recorded in provenance and checked on resume."""
        from timm.data import resolve_data_config

        data = resolve_data_config(
            {
                "input_size": (3, self.resolution, self.resolution),
                **({"interpolation": self.interpolation} if self.interpolation else {}),
                **({"crop_pct": self.crop_pct} if self.crop_pct else {}),
            },
            model=model,
        )
        return {
            "name": self.name,
            "resolution": self.resolution,
            "interpolation": data["interpolation"],
            "crop_pct": data["crop_pct"],
            "mean": list(data["mean"]),
            "std": list(data["std"]),
            "precision": self.precision,
            "storage": self.storage,
            "pretrained": self.pretrained,
            "checkpoint": None
            if self.checkpoint is None
            else {
                "name": self.checkpoint.name,
                "bytes": self.checkpoint.stat().st_size,
                "mtime": int(self.checkpoint.stat().st_mtime),
            },
            "embedding_dim": int(model.num_features),
        }
