"""Image classification data: CIFAR-100(-LT) and Fashion-MNIST(-LT) from their on-disk formats,
and two loaders (the device-resident fast path and torchvision's DataLoader path); ImageNet-LT and
Places-LT from the OLTR split lists over image files, decoded by worker processes."""

from topklab.data.vision.datasets import CIFAR100, FashionMNIST, ImageDataset
from topklab.data.vision.listed import ListedImageDataset, ListedSplits, SeededImageLoader
from topklab.data.vision.loaders import DeviceLoader, TorchvisionLoader, build_loader
from topklab.data.vision.splits import VisionSplits

__all__ = [
    "CIFAR100",
    "DeviceLoader",
    "FashionMNIST",
    "ImageDataset",
    "ListedImageDataset",
    "ListedSplits",
    "SeededImageLoader",
    "TorchvisionLoader",
    "VisionSplits",
    "build_loader",
]
