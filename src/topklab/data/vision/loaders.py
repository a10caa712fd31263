"""Two ways to feed uint8 images to a model, with the same augmentation (zero-padded random crop,
horizontal flip) and normalisation:

- :class:`DeviceLoader`, the fast path: the whole set is one uint8 tensor on the device; crops and
  flips are gathered there for a whole batch at once.
- :class:`TorchvisionLoader`: ``torch.utils.data.DataLoader`` with per-image ``transforms.v2``.

Both draw every epoch's randomness from ``(seed, epoch)`` alone, so an epoch can be replayed,
or resumed at any batch, exactly (:meth:`batches` takes the first batch to yield).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import torch
import torch.nn.functional as F

from topklab.utils.batching import batches_per_epoch

LOADERS = ("device", "torchvision")


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % 2**63


class DeviceLoader:
    """Batches of normalised float images from a uint8 tensor kept on ``device``.

    Parameters
    ----------
    images : uint8 tensor (N, C, H, W); labels : int64 tensor (N,)
    batch_size : int >= 1
    mean, std : per-channel normalisation on the [0, 1] scale
    train : bool, shuffle and augment (False: fixed order, no augmentation)
    augment : bool or None, augment whatever ``train`` says (None: as ``train``); an augmented
        evaluation split (difftopk validates on augmented images) keeps its order
    pad : int >= 0, zero padding of the random crop (0 disables cropping)
    flip : bool, random horizontal flip with probability 1/2
    drop_last : bool, drop an incomplete last batch (never the only one)
    channels_last : bool, return batches in channels-last memory format
    seed : int, with the epoch number, the only source of the loader's randomness

    Examples
    --------
    >>> images = torch.zeros(10, 3, 8, 8, dtype=torch.uint8)
    >>> loader = DeviceLoader(images, torch.arange(10), 4, [0.5] * 3, [0.5] * 3, train=True)
    >>> [tuple(x.shape) for x, _ in loader.batches(epoch=0)]
    [(4, 3, 8, 8), (4, 3, 8, 8), (2, 3, 8, 8)]
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        mean,
        std,
        train: bool,
        device: str | torch.device = "cpu",
        pad: int = 4,
        flip: bool = True,
        drop_last: bool = False,
        channels_last: bool = False,
        seed: int = 0,
        augment: bool | None = None,
    ):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be a uint8 tensor (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        self.device = torch.device(device)
        self.batch_size, self.train, self.drop_last, self.seed = batch_size, train, drop_last, seed
        augment = train if augment is None else augment
        self.pad = pad if augment else 0
        self.flip = flip and augment
        self.size = images.shape[-2:]
        self.channels_last = channels_last
        stored = images.to(self.device)
        self.images = F.pad(stored, (self.pad,) * 4) if self.pad else stored
        self.labels = labels.to(self.device)
        shape = (1, -1, 1, 1)
        self.mean = torch.tensor(mean, device=self.device).view(shape) * 255.0
        self.std = torch.tensor(std, device=self.device).view(shape) * 255.0

    def __len__(self) -> int:
        return batches_per_epoch(len(self.labels), self.batch_size, self.drop_last)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.labels)
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        order = torch.randperm(n, generator=generator) if self.train else torch.arange(n)
        offsets = torch.randint(0, 2 * self.pad + 1, (2, n), generator=generator) if self.pad else None
        flips = torch.rand(n, generator=generator) < 0.5 if self.flip else None
        order = order.to(self.device)
        offsets = None if offsets is None else offsets.to(self.device)
        flips = None if flips is None else flips.to(self.device)
        height, width = self.size
        # every padded crop position as a view (N, C, 2p+1, 2p+1, H, W): a crop is one block index
        windows = self.images.unfold(2, height, 1).unfold(3, width, 1) if offsets is not None else None
        for b in range(start, len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            x = windows[idx, :, offsets[0, idx], offsets[1, idx]] if windows is not None else self.images[idx]
            if flips is not None:
                flipped = flips[idx]
                x[flipped] = x[flipped].flip(-1)
            x = (x.float() - self.mean) / self.std
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.labels[idx]


class _AugmentedImages(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), self.labels[i]


class TorchvisionLoader:
    """The same batches' distribution as :class:`DeviceLoader` through a ``DataLoader`` with
    ``transforms.v2`` (RandomCrop with zero padding, RandomHorizontalFlip, ToDtype, Normalize).

    Parameters are those of :class:`DeviceLoader` plus ``num_workers`` (int >= 0). With workers,
    each epoch's worker seeds come from the epoch's generator; with ``num_workers=0`` the
    transforms draw from torch's global generator, which is re-seeded from (seed, epoch) at the
    start of each epoch; a mid-epoch resume then replays the skipped batches' draws back to back,
    which is exact only while the training step itself draws nothing from that generator (true
    for the models and losses here; not with dropout). The device loader has no such caveat.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        mean,
        std,
        train: bool,
        device: str | torch.device = "cpu",
        pad: int = 4,
        flip: bool = True,
        drop_last: bool = False,
        channels_last: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        augment: bool | None = None,
    ):
        from torchvision.transforms import v2

        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.augment = train if augment is None else augment
        steps = []
        if self.augment and pad:
            steps.append(v2.RandomCrop(tuple(images.shape[-2:]), padding=pad, fill=0))
        if self.augment and flip:
            steps.append(v2.RandomHorizontalFlip())
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
        self.dataset = _AugmentedImages(images, labels, v2.Compose(steps))
        self.device = torch.device(device)
        self.batch_size, self.train, self.drop_last, self.seed = batch_size, train, drop_last, seed
        self.num_workers, self.channels_last = num_workers, channels_last

    def __len__(self) -> int:
        return batches_per_epoch(len(self.dataset), self.batch_size, self.drop_last)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        seed = epoch_seed(self.seed, epoch)
        if self.num_workers == 0 and self.augment:
            torch.manual_seed(seed + 1)
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=self.train,
            num_workers=self.num_workers,
            drop_last=self.drop_last and len(self.dataset) > self.batch_size,
            generator=torch.Generator().manual_seed(seed),
            pin_memory=self.device.type == "cuda",
        )
        for x, y in islice(loader, start, None):
            x = x.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, y.to(self.device, non_blocking=True)


def build_loader(
    kind: str,
    images,
    labels,
    batch_size: int,
    mean,
    std,
    train: bool,
    device,
    *,
    pad: int,
    flip: bool,
    drop_last: bool,
    channels_last: bool,
    seed: int,
    num_workers: int = 0,
    augment: bool | None = None,
):
    """``kind`` = device | torchvision (the config field ``dataset.loader``)."""
    common = dict(
        device=device, pad=pad, flip=flip, drop_last=drop_last, channels_last=channels_last, seed=seed, augment=augment
    )
    if kind == "device":
        return DeviceLoader(images, labels, batch_size, mean, std, train, **common)
    if kind == "torchvision":
        return TorchvisionLoader(images, labels, batch_size, mean, std, train, num_workers=num_workers, **common)
    raise ValueError(f"dataset.loader={kind!r}; choose one of {', '.join(LOADERS)}")
