"""What a vision dataset hands the engine: uint8 image tensors per split plus what models and
losses need to know about the data (channels, classes, training class counts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from topklab.data.vision.listed import ArrayImages, SeededImageLoader, image_transforms
from topklab.data.vision.loaders import build_loader


@dataclass
class VisionSplits:
    """Train / validation / test images (uint8, N × C × H × W) and int64 labels.

    ``mean``/``std`` are per-channel, on the [0, 1] scale, for normalisation after augmentation.
    ``loader`` (device | torchvision | resized), ``num_workers``, ``pad`` and ``flip`` say how batches
    are made and augmented (see :mod:`topklab.data.vision.loaders`); ``resized`` decodes each image
    to PIL and applies the ViT pipeline of :func:`~topklab.data.vision.listed.image_transforms`
    with ``resize`` = {resolution, interpolation, tte, tte_expand} (PEL/LIFT's CIFAR-100-LT at 224).
    ``info`` (seeds, sizes, class counts) goes into the run's summary; ``indices`` (the long-tailed
    subset's and the validation split's source indices) into its ``indices.json``.
    """

    name: str
    num_classes: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    info: dict = field(default_factory=dict)
    indices: dict = field(default_factory=dict)
    source_counts: list[int] | None = None
    task: str = "multiclass"
    loader: str = "device"
    num_workers: int = 0
    pad: int = 4
    flip: bool = True
    resize: dict | None = None
    augment_val: bool = False

    @property
    def in_channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def class_counts(self) -> list[int]:
        """Training images per class (after any long-tailed subsampling and validation hold-out)."""
        return torch.bincount(self.y_train, minlength=self.num_classes).tolist()

    @property
    def shot_counts(self) -> list[int]:
        """Per-class sizes that define the many / medium / few groups: the (long-tailed) training
        set before the validation hold-out, so a hold-out cannot move a class across a threshold."""
        return self.source_counts if self.source_counts is not None else self.class_counts

    def provides(self) -> dict:
        """What models, losses and the task may ask of the data (by constructor argument name)."""
        return {
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
            "class_counts": self.class_counts,
            "shot_counts": self.shot_counts,
        }

    def targets(self, split: str) -> torch.Tensor:
        return getattr(self, f"y_{split}")

    def _loader(
        self,
        images,
        labels,
        batch_size,
        train,
        device,
        drop_last,
        seed,
        channels_last,
        plain: bool = False,
        augment: bool | None = None,
    ):
        if self.loader == "resized":
            transform = image_transforms(train, mean=self.mean, std=self.std, plain=plain, **self.resize)
            return SeededImageLoader(
                ArrayImages(images, labels.numpy(), transform, None),
                batch_size,
                train,
                drop_last,
                seed,
                self.num_workers,
                device,
                channels_last,
            )
        return build_loader(
            self.loader,
            images,
            labels,
            batch_size,
            self.mean,
            self.std,
            train,
            device,
            pad=self.pad,
            flip=self.flip,
            drop_last=drop_last,
            channels_last=channels_last,
            seed=seed,
            num_workers=self.num_workers,
            augment=augment,
        )

    def train_loader(self, batch_size: int, drop_last: bool, seed: int, device, channels_last: bool = False):
        """Augmented, shuffled batches; an epoch's randomness comes from (seed, epoch) alone."""
        return self._loader(self.x_train, self.y_train, batch_size, True, device, drop_last, seed, channels_last)

    def eval_loader(self, split: str, batch_size: int | None, device, channels_last: bool = False):
        """The split in its stored order, without augmentation (the validation split with the training
        augmentation, one fixed seeded draw, when ``augment_val``: difftopk's CIFAR-100 hold-out)."""
        labels = self.targets(split)
        augment = self.augment_val and split == "val"
        return self._loader(
            getattr(self, f"x_{split}"),
            labels,
            batch_size or len(labels),
            False,
            device,
            False,
            0,
            channels_last,
            augment=augment,
        )

    def feature_loader(self, batch_size: int, device, channels_last: bool = False):
        """The training images in stored order without augmentation (one plain crop when resized),
        for heads initialised from class-mean features."""
        return self._loader(self.x_train, self.y_train, batch_size, False, device, False, 0, channels_last, plain=True)

    def sizes(self) -> dict:
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


def as_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(np.asarray(labels, dtype=np.int64))


def holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) positions: ``fraction`` of each class held out (rounded half-up, and never a
    class's last image), so a long-tailed class cannot vanish from training. On a balanced set it
    holds out as many images as difftopk's random_split (5 % of CIFAR-100: 25 per class)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction={fraction} must lie in (0, 1)")
    rng = np.random.RandomState(seed)
    val = []
    for c in np.unique(labels):
        pool = rng.permutation(np.flatnonzero(labels == c))
        val.append(pool[: min(int(np.floor(fraction * len(pool) + 0.5)), len(pool) - 1)])
    val = np.sort(np.concatenate(val))
    if len(val) == 0:
        raise ValueError(f"val_fraction={fraction} holds out no image of {len(labels)}; raise it")
    return np.setdiff1d(np.arange(len(labels)), val), val


def random_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) positions: ``floor(fraction · N)`` positions drawn at random, whatever their class
    (difftopk's ``random_split(main_set, [N − N // 20, N // 20])`` for 5 %).

    Examples
    --------
    >>> train, val = random_holdout(np.zeros(100), 0.05, seed=0)
    >>> len(train), len(val), bool(np.all(np.diff(val) > 0))
    (95, 5, True)
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction={fraction} must lie in (0, 1)")
    count = int(len(labels) * fraction)
    if count == 0:
        raise ValueError(f"val_fraction={fraction} holds out no image of {len(labels)}; raise it")
    val = np.sort(np.random.RandomState(seed).permutation(len(labels))[:count])
    return np.setdiff1d(np.arange(len(labels)), val), val


def balanced_from_unused(
    labels: np.ndarray, used: np.ndarray, per_class: int, num_classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` images of every class for a balanced validation set: first from the training
    images the subset left unused, then, where a class has too few of those (CIFAR-100-LT's class 0
    uses all 500), the rest from that class's subset images, which leave training (never its last).

    Returns (validation indices, the subset indices moved to validation), both sorted.

    Examples
    --------
    >>> labels = np.repeat(np.arange(2), 4)                    # class 0: 0-3, class 1: 4-7
    >>> val, moved = balanced_from_unused(labels, np.array([0, 1, 2, 3, 4]), 2, 2, seed=0)
    >>> np.bincount(labels[val]).tolist(), len(moved), bool(set(moved) <= {0, 1, 2, 3})
    ([2, 2], 2, True)
    """
    if per_class < 1:
        raise ValueError(f"val_per_class={per_class} must be >= 1")
    unused = np.ones(len(labels), dtype=bool)
    unused[used] = False
    in_subset = ~unused
    rng = np.random.RandomState(seed)
    chosen, moved = [], []
    for c in range(num_classes):
        pool = rng.permutation(np.flatnonzero(unused & (labels == c)))[:per_class]
        short = per_class - len(pool)
        if short:
            subset = rng.permutation(np.flatnonzero(in_subset & (labels == c)))
            if short > len(subset) - 1:
                raise ValueError(
                    f"class {c} has {len(pool)} unused and {len(subset)} subset images, too few for "
                    f"val_per_class={per_class} while keeping one for training; lower it or use validation=holdout"
                )
            moved.append(subset[:short])
            pool = np.concatenate([pool, subset[:short]])
        chosen.append(pool)
    moved = np.sort(np.concatenate(moved)) if moved else np.array([], dtype=np.int64)
    return np.sort(np.concatenate(chosen)), moved
