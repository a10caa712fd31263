"""``dataset=imagenet_lt | places_lt``: images on disk named by the OLTR split lists, decoded by
worker processes, with CLIP-style preprocessing as PEL/LIFT applies it.

Training: RandomResizedCrop(resolution) + horizontal flip; evaluation: Resize(resolution · 8/7) +
CenterCrop(resolution), or the test-time ensemble (``tte``): Resize(resolution + 24) and five (or
ten, with flips) crops, whose logits the task averages. Every random draw of an image comes from
(seed, epoch, position in the epoch), so an epoch replays exactly, whichever worker decodes the
image, and a run resumes mid-epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from topklab.data.vision.lists import read_classnames, read_split_list, require_list
from topklab.data.vision.loaders import epoch_seed
from topklab.utils.batching import batches_per_epoch
from topklab.utils.checks import check_int
from topklab.utils.errors import DataUnavailableError, TopklabError

INTERPOLATIONS = ("bilinear", "bicubic")
TTE_MODES = ("none", "fivecrop", "tencrop")
SPLITS = ("train", "val", "test")


def image_transforms(
    train: bool,
    resolution: int,
    mean,
    std,
    interpolation: str = "bilinear",
    tte: str = "none",
    tte_expand: int = 24,
    plain: bool = False,
):
    """torchvision transforms of a PIL image: the training augmentation, the single centre crop,
    a (crops, C, H, W) stack for the test-time ensemble, or (``plain``) Resize + CenterCrop at the
    resolution itself (PEL/LIFT's transform for features that initialise a head)."""
    from torchvision.transforms import v2

    import topklab.compat  # noqa: F401  (torchvision on a CPU-only torch)

    mode = getattr(v2.InterpolationMode, interpolation.upper())
    to_tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    if train:
        return v2.Compose([v2.RandomResizedCrop(resolution, interpolation=mode), v2.RandomHorizontalFlip(), *to_tensor])
    if plain or tte == "none":
        resize = resolution if plain else resolution * 8 // 7
        return v2.Compose([v2.Resize(resize, interpolation=mode), v2.CenterCrop(resolution), *to_tensor])
    crops = v2.FiveCrop(resolution) if tte == "fivecrop" else v2.TenCrop(resolution)
    return v2.Compose(
        [v2.Resize(resolution + tte_expand, interpolation=mode), crops, StackViews(v2.Compose(to_tensor))]
    )


def check_resize(resolution, interpolation: str, tte: str, tte_expand: int) -> None:
    check_int("dataset.resolution", resolution, why="224 for ViT-B/16")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"dataset.interpolation={interpolation!r}; choose one of {', '.join(INTERPOLATIONS)}")
    if tte not in TTE_MODES:
        raise ValueError(f"dataset.tte={tte!r}; choose one of {', '.join(TTE_MODES)}")
    if tte_expand < 0:
        raise ValueError(f"dataset.tte_expand={tte_expand} must be >= 0")


class StackViews:
    """The crops of a test-time ensemble, each made a normalised tensor, stacked (crops, C, H, W)."""

    def __init__(self, each):
        self.each = each

    def __call__(self, views) -> torch.Tensor:
        return torch.stack([self.each(view) for view in views])


class SeededImages(torch.utils.data.Dataset):
    """``(image tensor, label)`` of item ``(position, index)``: image ``index`` through the transform,
    its random draws seeded by (seed, position) when a seed is set. Subclasses give :meth:`image`."""

    def __init__(self, labels: np.ndarray, transform, seed: int | None):
        self.labels, self.transform, self.seed = labels, transform, seed

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, index: int):
        raise NotImplementedError

    def __getitem__(self, item: tuple[int, int]):
        position, index = item
        image = self.image(index)
        if self.seed is None:
            return self.transform(image), int(self.labels[index])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + position) % 2**63)
            return self.transform(image), int(self.labels[index])


class ImageFiles(SeededImages):
    """The RGB image files ``root / path``."""

    def __init__(self, root: Path, paths: list[str], labels: np.ndarray, transform, seed: int | None):
        super().__init__(labels, transform, seed)
        self.root, self.paths = root, paths

    def image(self, index: int):
        from PIL import Image, UnidentifiedImageError

        path = self.root / self.paths[index]
        try:
            with Image.open(path) as handle:
                return handle.convert("RGB")
        except (OSError, UnidentifiedImageError, ValueError) as err:
            raise TopklabError(
                f"image {path} cannot be read ({type(err).__name__}: {err}); "
                f"replace it or remove its line from the split list"
            ) from None


class ArrayImages(SeededImages):
    """In-memory uint8 images (N, C, H, W), handed to the transform as RGB PIL images, so small
    images (CIFAR's 32 × 32) go through the same resize, crop and interpolation as image files."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray, transform, seed: int | None):
        super().__init__(labels, transform, seed)
        self.images = images

    def image(self, index: int):
        from PIL import Image

        pixels = self.images[index].permute(1, 2, 0).numpy()
        return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")


def _one_line(err: Exception) -> TopklabError:
    """A worker's TopklabError arrives wrapped in a traceback; keep its message."""
    return TopklabError(str(err).strip().splitlines()[-1].split("TopklabError: ", 1)[-1])


class SeededImageLoader:
    """Batches of decoded, transformed images through a ``DataLoader`` (``num_workers`` processes).

    Parameters
    ----------
    dataset : :class:`SeededImages` (its ``seed`` is replaced by the epoch's for training)
    batch_size : int >= 1; train : bool, shuffle and augment in an order drawn from (seed, epoch)
    drop_last : bool, drop an incomplete last batch (never the only one)
    seed : int; num_workers : int >= 0; device : where batches are returned
    """

    def __init__(
        self,
        dataset: SeededImages,
        batch_size: int,
        train: bool,
        drop_last: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        device: str | torch.device = "cpu",
        channels_last: bool = False,
    ):
        self.dataset, self.batch_size, self.train, self.drop_last = dataset, batch_size, train, drop_last
        self.seed, self.num_workers, self.device, self.channels_last = (
            seed,
            num_workers,
            torch.device(device),
            channels_last,
        )

    def __len__(self) -> int:
        return batches_per_epoch(len(self.dataset), self.batch_size, self.drop_last)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.dataset)
        seed = epoch_seed(self.seed, epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if self.train else torch.arange(n)
        order = order[: len(self) * self.batch_size].tolist()
        self.dataset.seed = seed if self.train else None
        items = list(enumerate(order))[start * self.batch_size :]
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=items,
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",
        )
        try:
            for x, y in loader:
                x = x.to(self.device, non_blocking=True)
                if self.channels_last and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                yield x, y.to(self.device, non_blocking=True)
        except TopklabError as err:
            raise _one_line(err) from None


class ListedSplits:
    """The three splits of a listed dataset: relative paths and labels, the class names, and loaders.

    ``provides()`` gives in_channels, num_classes, class_counts / shot_counts (training images per
    class) and class_names (for classifier heads initialised from text).
    """

    task = "multiclass"

    def __init__(
        self, name: str, root: Path, files: dict, class_names: list[str], transforms: dict, num_workers: int, info: dict
    ):
        self.name, self.root, self.files, self.class_names = name, root, files, class_names
        self.transforms, self.num_workers, self.info, self.indices = transforms, num_workers, info, {}
        self.num_classes = len(class_names)

    @property
    def class_counts(self) -> list[int]:
        return np.bincount(self.files["train"][1], minlength=self.num_classes).tolist()

    def provides(self) -> dict:
        return {
            "in_channels": 3,
            "num_classes": self.num_classes,
            "class_counts": self.class_counts,
            "shot_counts": self.class_counts,
            "class_names": self.class_names,
        }

    def targets(self, split: str) -> torch.Tensor:
        return torch.as_tensor(self.files[split][1])

    def _loader(self, split, batch_size, train, drop_last, seed, device, channels_last, transform: str | None = None):
        paths, labels = self.files[split]
        dataset = ImageFiles(
            self.root, paths, labels, self.transforms[transform or ("train" if train else "eval")], None
        )
        return SeededImageLoader(dataset, batch_size, train, drop_last, seed, self.num_workers, device, channels_last)

    def train_loader(self, batch_size: int, drop_last: bool, seed: int, device, channels_last: bool = False):
        return self._loader("train", batch_size, True, drop_last, seed, device, channels_last)

    def eval_loader(self, split: str, batch_size: int | None, device, channels_last: bool = False):
        return self._loader(split, batch_size or len(self.files[split][0]), False, False, 0, device, channels_last)

    def feature_loader(self, batch_size: int, device, channels_last: bool = False):
        """The training images in stored order through the plain transform (one centre crop)."""
        return self._loader("train", batch_size, False, False, 0, device, channels_last, transform="plain")


class ListedImageDataset:
    """ImageNet-LT / Places-LT: OLTR split lists in ``split_dir`` over images in ``root``.

    Parameters
    ----------
    name : the dataset's name in results; num_classes : int (1000, 365)
    root : the image root the lists' relative paths start from (ILSVRC2012 ``train/`` and ``val/``;
        Places365-Standard small images laid out as ``train/<scene>/`` and ``val/<scene>/``)
    split_dir : folder of the list files and ``classnames.txt`` (they are not committed here)
    lists : {train, val, test} → list file name; list_source : where a missing list comes from
    mean, std : normalisation (CLIP's by default); resolution : int, the crop side (224 for ViT-B/16)
    interpolation : bilinear | bicubic, of every resize (PEL/LIFT: torchvision's default bilinear;
        CLIP's own preprocessing: bicubic); recorded in the run's info
    tte : none | fivecrop | tencrop, the evaluation transform (PEL/LIFT's test-time ensemble:
        Resize(resolution + tte_expand) and five crops, logits averaged); tte_expand : int >= 0
    num_workers : int >= 0, decoding processes
    task : multiclass; split_seed : int (recorded; the lists fix the splits)
    """

    def __init__(
        self,
        name: str,
        root: str,
        split_dir: str,
        lists: dict,
        num_classes: int,
        classnames: str = "classnames.txt",
        list_source: str = "",
        mean=(0.48145466, 0.4578275, 0.40821073),
        std=(0.26862954, 0.26130258, 0.27577711),
        resolution: int = 224,
        interpolation: str = "bilinear",
        tte: str = "none",
        tte_expand: int = 24,
        num_workers: int = 8,
        task: str = "multiclass",
        split_seed: int = 0,
    ):
        check_resize(resolution, interpolation, tte, tte_expand)
        if set(lists) != set(SPLITS):
            raise ValueError(f"dataset.lists needs exactly the keys train, val, test, got {sorted(lists)}")
        if num_workers < 0:
            raise ValueError(f"dataset.num_workers={num_workers} must be >= 0")
        if task != "multiclass":
            raise ValueError(f"task={task!r}: image datasets are multiclass")
        self.name, self.root, self.split_dir, self.lists = name, Path(root), Path(split_dir), dict(lists)
        self.num_classes, self.classnames, self.list_source = num_classes, classnames, list_source
        self.mean, self.std, self.resolution, self.interpolation = tuple(mean), tuple(std), resolution, interpolation
        self.tte, self.tte_expand, self.num_workers, self.task, self.split_seed = (
            tte,
            tte_expand,
            num_workers,
            task,
            split_seed,
        )

    def data_files(self) -> dict[str, Path]:
        """The split lists and class names it reads (:mod:`topklab.data.fingerprint`); the images the lists
        name are not hashed (a changed image under an unchanged list is not seen)."""
        lists = {
            f"{split}.list": require_list(self.split_dir / listing, self.list_source)
            for split, listing in self.lists.items()
        }
        return {**lists, "classnames": self.split_dir / self.classnames}

    def splits(self) -> ListedSplits:
        if not self.root.is_dir():
            raise DataUnavailableError(
                f"dataset {self.name}: image root {self.root} not found; set dataset.root to the "
                f"folder the split lists' paths start from (docs/vit.md)"
            )
        files = {
            split: read_split_list(self.split_dir / listing, self.num_classes, self.list_source)
            for split, listing in self.lists.items()
        }
        for split, (paths, _) in files.items():
            if not (self.root / paths[0]).is_file():
                raise DataUnavailableError(
                    f"dataset {self.name}: {self.root / paths[0]} (first image of the {split} list) "
                    f"not found; dataset.root must be the folder its paths start from"
                )
        class_names = read_classnames(self.split_dir / self.classnames, self.num_classes)
        transforms = {
            "train": image_transforms(True, self.resolution, self.mean, self.std, self.interpolation),
            "eval": image_transforms(
                False, self.resolution, self.mean, self.std, self.interpolation, self.tte, self.tte_expand
            ),
            "plain": image_transforms(False, self.resolution, self.mean, self.std, self.interpolation, plain=True),
        }
        info = {
            "split_seed": self.split_seed,
            "sizes": {s: len(files[s][0]) for s in SPLITS},
            "interpolation": self.interpolation,
            "resolution": self.resolution,
            "tte": self.tte,
            "class_counts": np.bincount(files["train"][1], minlength=self.num_classes).tolist(),
        }
        info["shot_counts"] = info["class_counts"]
        return ListedSplits(self.name, self.root, files, class_names, transforms, self.num_workers, info)
