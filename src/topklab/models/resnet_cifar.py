"""ResNets for 32×32-class images: He et al.'s CIFAR ResNet-32 (the usual CIFAR-LT backbone) and the
CIFAR variant of ResNet-18 used by Petersen et al. (3×3 stem; difftopk's keeps a max-pool after it).
Any input size works (global average pooling); ``in_channels`` comes from the dataset (3 for CIFAR, 1 for Fashion-MNIST)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity shortcut.

    ``shortcut="zero_pad"``: when the shape changes, the shortcut subsamples by 2 and zero-pads the
    channels (He et al. 2016, option A; parameter-free). ``"projection"``: 1×1 conv + BN (option B).
    """

    def __init__(self, in_planes: int, planes: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut_kind = shortcut
        self.extra_channels = planes - in_planes
        self.subsample = stride != 1 or in_planes != planes
        if self.subsample and shortcut == "projection":
            self.projection = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        self.stride = stride

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if not self.subsample:
            return x
        if self.shortcut_kind == "projection":
            return self.projection(x)
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra_channels - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """A 3×3-stem ResNet of basic blocks for small images.

    Parameters
    ----------
    num_classes : int >= 2, outputs (logits)
    in_channels : int >= 1, image channels
    widths : channels of each stage; the first stage keeps the resolution, later ones halve it
    blocks : basic blocks per stage
    shortcut : zero_pad | projection (see :class:`BasicBlock`)
    stem_pool : bool, a 3×3 max-pool of stride 2 after the stem (torchvision's ResNet keeps it in
        difftopk's CIFAR ResNet-18: the stages then run at 16, 8, 4, 2 px on 32-px images)
    init : he | torchvision; he: Kaiming-normal (fan-in) convolutions and classifier; torchvision:
        Kaiming-normal fan-out convolutions, PyTorch's default classifier (difftopk's ResNet-18)
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        widths=(16, 32, 64),
        blocks=(5, 5, 5),
        shortcut: str = "zero_pad",
        stem_pool: bool = False,
        init: str = "he",
    ):
        super().__init__()
        if shortcut not in ("zero_pad", "projection"):
            raise ValueError(f"shortcut={shortcut!r}; choose zero_pad or projection")
        if init not in ("he", "torchvision"):
            raise ValueError(f"model.init={init!r}; choose he or torchvision")
        if len(widths) != len(blocks) or num_classes < 2 or in_channels < 1:
            raise ValueError(
                f"need one width per stage ({list(widths)} vs {list(blocks)}), num_classes >= 2, in_channels >= 1"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            *([nn.MaxPool2d(3, 2, 1)] if stem_pool else []),
        )
        layers, in_planes = [], widths[0]
        for stage, (planes, count) in enumerate(zip(widths, blocks)):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(BasicBlock(in_planes, planes, stride, shortcut))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_planes, num_classes)
        for module in self.modules():
            if init == "torchvision" and isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif init == "he" and isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def resnet32(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """ResNet-32 for CIFAR (He et al. 2016 §4.2): 3 stages of 5 blocks, 16/32/64 channels,
    zero-padding shortcuts; 0.46 M parameters at 100 classes.

    Examples
    --------
    >>> resnet32(num_classes=100)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 100])
    """
    return CifarResNet(num_classes, in_channels, (16, 32, 64), (5, 5, 5), "zero_pad")


def resnet18_cifar(num_classes: int, in_channels: int = 3, stem_pool: bool = False, init: str = "he") -> CifarResNet:
    """ResNet-18, CIFAR variant: 3×3 stem, 4 stages of 2 blocks, 64–512 channels, projection
    shortcuts; 11.2 M parameters at 100 classes. difftopk's ``resnet_cifar10.py`` also keeps
    torchvision's max-pool after the stem and its fan-out initialisation (``stem_pool=True,
    init="torchvision"``, set in the Petersen rows): a quarter of the compute of the pool-less net.

    Examples
    --------
    >>> resnet18_cifar(num_classes=10, in_channels=1)(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """
    return CifarResNet(num_classes, in_channels, (64, 128, 256, 512), (2, 2, 2, 2), "projection", stem_pool, init)
