"""``dataset=cifar100 | cifar100lt | fmnistlt``: image classification sets built from their real
on-disk files, with a seeded long-tailed subset and a seeded validation split (both separate from
the training seed)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from topklab.data.vision.files import (
    FASHION_MNIST_FILES,
    ensure_cifar100,
    find_fashion_mnist,
    read_cifar100_split,
    read_fashion_mnist_split,
)
from topklab.data.vision.listed import check_resize
from topklab.data.vision.loaders import LOADERS
from topklab.data.vision.longtail import exponential_profile, longtail_indices
from topklab.data.vision.splits import VisionSplits, as_tensors, balanced_from_unused, holdout, random_holdout
from topklab.utils.errors import TopklabError

VALIDATION_MODES = ("holdout", "random_holdout", "balanced_unused")
LOADER_KINDS = (*LOADERS, "resized")


class ImageDataset:
    """Shared split logic. Subclasses implement :meth:`read` -> (x_train, y_train, x_test, y_test).

    Parameters
    ----------
    imbalance_ratio : float >= 1 or None
        None keeps the training set as it is; ρ >= 1 draws an exponential long-tailed subset with
        ``n_max`` images in class 0 and n_max/ρ in the last class.
    n_max : int, images of the largest class of the long-tailed subset
    lt_seed : int, seed of the long-tailed draw (kept fixed across training seeds)
    validation : holdout | random_holdout | balanced_unused
        holdout: ``val_fraction`` of each class of the (subsampled) training set;
        random_holdout: ``floor(val_fraction · N)`` training images drawn at random, not per class
        (difftopk's ``random_split``: 2,500 of CIFAR-100's 50,000);
        balanced_unused: ``val_per_class`` images per class from training images the long-tailed
        subset did not use (a balanced validation set, like the balanced test set), topped up from
        the subset for a class that has too few unused images (those leave training; recorded as
        ``val_from_subset``).
    split_seed : int, seed of the validation draw
    loader : device | torchvision | resized, how batches are made: the uint8 set on the device and
        augmented there, a DataLoader with per-image transforms and ``num_workers`` processes, or
        (resized) PEL/LIFT's ViT pipeline at ``resolution``: RandomResizedCrop + flip for training,
        Resize(resolution · 8/7) + CenterCrop or the test-time ensemble ``tte`` for evaluation
    pad : int >= 0, zero padding of the random crop (0: no crop); flip : bool, random horizontal flip
        (device and torchvision loaders)
    val_augment : bool, score the validation split on training-augmented images (one fixed seeded draw;
        difftopk's hold-out is a split of the augmented training set)
    resolution : int >= 1 or None, interpolation : bilinear | bicubic, tte : none | fivecrop |
        tencrop, tte_expand : int >= 0 (the resized loader; see :class:`ListedImageDataset`)
    task : multiclass (what the labels are; recipes key on it)
    """

    name = "images"
    num_classes = 0

    def __init__(
        self,
        root: str,
        mean,
        std,
        imbalance_ratio: float | None = None,
        n_max: int | None = None,
        lt_seed: int = 0,
        validation: str = "holdout",
        val_fraction: float = 0.05,
        val_per_class: int = 50,
        split_seed: int = 0,
        download: bool = False,
        loader: str = "device",
        num_workers: int = 0,
        pad: int = 4,
        flip: bool = True,
        resolution: int | None = None,
        interpolation: str = "bilinear",
        tte: str = "none",
        tte_expand: int = 24,
        task: str = "multiclass",
        val_augment: bool = False,
    ):
        if task != "multiclass":
            raise ValueError(f"task={task!r}: image datasets are multiclass")
        if loader not in LOADER_KINDS:
            raise ValueError(f"loader={loader!r}; choose one of {', '.join(LOADER_KINDS)}")
        if loader == "resized":
            check_resize(resolution, interpolation, tte, tte_expand)
            if val_augment:
                raise ValueError("val_augment works with the device and torchvision loaders, not resized")
        if num_workers < 0 or pad < 0:
            raise ValueError(f"num_workers={num_workers} and pad={pad} must be >= 0")
        if validation not in VALIDATION_MODES:
            raise ValueError(f"validation={validation!r}; choose one of {', '.join(VALIDATION_MODES)}")
        if imbalance_ratio is not None and not float(imbalance_ratio) >= 1:
            raise ValueError(f"imbalance_ratio={imbalance_ratio} must be >= 1 (largest / smallest class) or null")
        if validation == "balanced_unused" and imbalance_ratio is None:
            raise ValueError("validation=balanced_unused needs a long-tailed subset (imbalance_ratio); use holdout")
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"mean {list(mean)} and std {list(std)} must have one entry per channel and std > 0")
        self.root = Path(root)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.imbalance_ratio = None if imbalance_ratio is None else float(imbalance_ratio)
        self.n_max = n_max
        self.lt_seed = lt_seed
        self.validation = validation
        self.val_fraction = val_fraction
        self.val_per_class = val_per_class
        self.split_seed = split_seed
        self.download = download
        self.task = task
        self.loading = {
            "loader": loader,
            "num_workers": num_workers,
            "pad": pad,
            "flip": flip,
            "augment_val": val_augment,
            "resize": {"resolution": resolution, "interpolation": interpolation, "tte": tte, "tte_expand": tte_expand}
            if loader == "resized"
            else None,
        }

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def splits(self) -> VisionSplits:
        x_train, y_train, x_test, y_test = self.read()
        info = {
            "split_seed": self.split_seed,
            "validation": self.validation,
            "source_train_size": len(y_train),
            "loader": self.loading["loader"],
            **(self.loading["resize"] or {}),
        }
        kept = np.arange(len(y_train))
        indices = {}
        try:
            if self.imbalance_ratio is not None:
                n_max = self.n_max or int(np.bincount(y_train, minlength=self.num_classes).min())
                counts = exponential_profile(n_max, self.num_classes, self.imbalance_ratio)
                kept = longtail_indices(y_train, counts, self.lt_seed)
                info.update(imbalance_ratio=self.imbalance_ratio, n_max=n_max, lt_seed=self.lt_seed, profile=counts)
                indices["longtail"] = kept.tolist()
            if self.validation in ("holdout", "random_holdout"):
                draw = holdout if self.validation == "holdout" else random_holdout
                train_pos, val_pos = draw(y_train[kept], self.val_fraction, self.split_seed)
                train_idx, val_idx = kept[train_pos], kept[val_pos]
                info["val_fraction"] = self.val_fraction
            else:
                val_idx, moved = balanced_from_unused(
                    y_train, kept, self.val_per_class, self.num_classes, self.split_seed
                )
                train_idx = np.setdiff1d(kept, moved)
                info.update(
                    val_per_class=self.val_per_class,
                    val_from_subset=np.bincount(y_train[moved], minlength=self.num_classes).tolist(),
                )
        except ValueError as err:
            raise TopklabError(f"dataset {self.name}: {err}") from None
        indices["val"] = val_idx.tolist()
        x_tr, y_tr = as_tensors(x_train[train_idx], y_train[train_idx])
        x_va, y_va = as_tensors(x_train[val_idx], y_train[val_idx])
        x_te, y_te = as_tensors(x_test, y_test)
        splits = VisionSplits(
            self.name,
            self.num_classes,
            x_tr,
            y_tr,
            x_va,
            y_va,
            x_te,
            y_te,
            self.mean,
            self.std,
            info,
            indices,
            source_counts=np.bincount(y_train[kept], minlength=self.num_classes).tolist(),
            **self.loading,
        )
        info["sizes"] = splits.sizes()
        info["class_counts"] = splits.class_counts
        info["shot_counts"] = splits.shot_counts
        return splits


class CIFAR100(ImageDataset):
    """CIFAR-100 from torchvision's ``cifar-100-python`` folder under ``root`` (50,000 + 10,000 images).

    With ``imbalance_ratio`` it is CIFAR-100-LT (papers.md §4.3): n_c = int(500 · ρ^(−c/99)),
    10,847 training images at ρ = 100.

    Examples
    --------
    >>> CIFAR100(root=".data", mean=[0.5] * 3, std=[0.25] * 3, imbalance_ratio=100).name
    'cifar100lt'
    """

    num_classes = 100

    def __init__(self, root: str, mean, std, **kwargs):
        super().__init__(root, mean, std, **kwargs)
        self.name = "cifar100" if self.imbalance_ratio is None else "cifar100lt"

    def data_files(self) -> dict[str, Path]:
        """The pickles it reads (:mod:`topklab.data.fingerprint`), downloaded first when asked and missing."""
        folder = ensure_cifar100(self.root, self.download)
        return {split: folder / split for split in ("train", "test")}

    def read(self):
        folder = ensure_cifar100(self.root, self.download)
        x_train, y_train = read_cifar100_split(folder / "train")
        x_test, y_test = read_cifar100_split(folder / "test")
        return x_train, y_train, x_test, y_test


def fashion_mnist_candidates(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    return [root, root / "usr/share/datasets/fashion-mnist", Path("/usr/share/datasets/fashion-mnist")]


class FashionMNIST(ImageDataset):
    """Fashion-MNIST (60,000 + 10,000 grey 28×28 images, 10 classes) from its IDX files: ``root``,
    Debian's package unpacked under ``root`` (``make data``) or installed system-wide.

    With ``imbalance_ratio=100, n_max=500`` it is ``fmnistlt``: CIFAR-100-LT's profile on 10
    classes, [500, 299, 179, 107, 64, 38, 23, 13, 8, 5] training images (1,236) (many / medium / few = 4 / 3 / 3 classes).
    """

    num_classes = 10

    def __init__(self, root: str, mean, std, **kwargs):
        super().__init__(root, mean, std, **kwargs)
        self.name = "fmnist" if self.imbalance_ratio is None else "fmnistlt"

    def data_files(self) -> dict[str, Path]:
        """The four IDX files it reads (:mod:`topklab.data.fingerprint`)."""
        folder = find_fashion_mnist(fashion_mnist_candidates(self.root))
        return {name: folder / name for name in FASHION_MNIST_FILES}

    def read(self):
        folder = find_fashion_mnist(fashion_mnist_candidates(self.root))
        x_train, y_train = read_fashion_mnist_split(folder, "train")
        x_test, y_test = read_fashion_mnist_split(folder, "t10k")
        return x_train, y_train, x_test, y_test
