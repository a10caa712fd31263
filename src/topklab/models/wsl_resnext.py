"""ResNeXt-101 32x48d WSL (Mahajan et al. 2018), the backbone of Petersen et al.'s ImageNet tables,
registered with timm as ``resnext101_32x48d``: timm 1.0 keeps its pretrained config
(``resnext101_32x48d.fb_wsl_ig1b_ft_in1k``, Facebook's ``ig_resnext101_32x48-3e41cc8a.pth``, CC-BY-NC)
but no longer registers the architecture. The weights load like every timm model's, from the hub
cache or from a local file (``pretrained_cfg_overlay={"file": path}``).

Examples
--------
>>> import timm, torch
>>> with torch.device("meta"):  # the architecture alone, without allocating its 3.3 GB of weights
...     model = timm.create_model("resnext101_32x48d", pretrained=False, num_classes=0)
>>> model.num_features, round(sum(p.numel() for p in model.parameters()) / 1e6)
(2048, 826)
"""

from __future__ import annotations

import timm
from timm.models import resnet
from timm.models._registry import register_model

ARCHITECTURE = "resnext101_32x48d"
default_cfgs = {ARCHITECTURE: resnet.default_cfgs[ARCHITECTURE]}  # timm's register_model reads this module's cfgs


def _resnext101_32x48d(pretrained: bool = False, **kwargs) -> resnet.ResNet:
    """ResNeXt-101 with cardinality 32 and base width 48 (about 826 M parameters with its 1000-class head)."""
    layout = dict(block=resnet.Bottleneck, layers=(3, 4, 23, 3), cardinality=32, base_width=48)
    return resnet._create_resnet(ARCHITECTURE, pretrained, **dict(layout, **kwargs))


if not timm.is_model(ARCHITECTURE):
    _resnext101_32x48d.__name__ = ARCHITECTURE  # timm registers an entry point under its function name
    register_model(_resnext101_32x48d)
