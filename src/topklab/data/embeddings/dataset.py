"""``dataset=imagenet1k_embeddings | imagenet21kp_embeddings | imagenet1k_l2_embeddings``: extracted
embeddings (:mod:`topklab.data.embeddings.store`) served to the engine straight from their memory
maps, with difftopk's hold-out: a random ``holdout`` of the training images is the validation set
(50,000 for ImageNet-1K, 100,000 for ImageNet-21K-P) and the official validation set is the test set."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from topklab.data.embeddings.store import CLASSES, EMBEDDINGS, LABELS, open_split, read_classes
from topklab.data.tensor_loader import TensorLoader
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError


class MappedLoader(TensorLoader):
    """Batches of rows ``index`` of a memory-mapped ``(N, D)`` array, as float32 on ``device``.

    The order of an epoch is :class:`TensorLoader`'s (the (e+1)-th permutation of a generator seeded
    with ``seed``); each batch reads its rows in file order (one pass over the pages it needs) and
    hands them back in the batch's order.

    Examples
    --------
    >>> rows = np.arange(12, dtype=np.float16).reshape(6, 2)
    >>> loader = MappedLoader(rows, torch.arange(6), np.array([5, 0, 3]), batch_size=2, shuffle=False)
    >>> [x[:, 0].tolist() for x, _ in loader.batches()]
    [[10.0, 0.0], [6.0]]
    """

    def __init__(
        self,
        embeddings: np.ndarray,
        labels: torch.Tensor,
        index: np.ndarray,
        batch_size: int | None,
        shuffle: bool,
        drop_last: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.embeddings, self.index, self.device = embeddings, np.asarray(index), torch.device(device)
        self.y = labels[torch.from_numpy(self.index)].to(self.device)
        self.batch_size = batch_size or len(self.index)
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self._generator, self._next_epoch = None, 0

    def rows(self, positions: np.ndarray) -> torch.Tensor:
        rows = self.index[positions]
        order = np.argsort(rows, kind="stable")
        block = np.empty((len(rows), self.embeddings.shape[1]), dtype=self.embeddings.dtype)
        block[order] = self.embeddings[rows[order]]
        return torch.from_numpy(block).to(self.device, torch.float32)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order(epoch).numpy() if self.shuffle else np.arange(len(self.index))
        for b in range(start, len(self)):
            positions = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.rows(positions), self.y[torch.from_numpy(positions).to(self.device)]


@dataclass
class EmbeddingSplits:
    """Train / validation / test as row indices into the stored splits' memory maps."""

    name: str
    num_classes: int
    arrays: dict  # stored split -> (embeddings memory map, labels tensor)
    parts: dict  # train | val | test -> (stored split, row indices)
    info: dict = field(default_factory=dict)
    indices: dict = field(default_factory=dict)
    task: str = "embeddings"

    @property
    def in_features(self) -> int:
        return int(self.arrays[self.parts["train"][0]][0].shape[1])

    @property
    def class_counts(self) -> list[int]:
        return torch.bincount(self.targets("train"), minlength=self.num_classes).tolist()

    def provides(self) -> dict:
        """What models, losses and the task may ask of the data (by constructor argument name)."""
        counts = self.class_counts
        return {
            "in_features": self.in_features,
            "num_classes": self.num_classes,
            "class_counts": counts,
            "shot_counts": counts,
        }

    def targets(self, split: str) -> torch.Tensor:
        stored, index = self.parts[split]
        return self.arrays[stored][1][torch.from_numpy(index)]

    def _loader(self, split, batch_size, shuffle, drop_last, seed, device) -> MappedLoader:
        stored, index = self.parts[split]
        embeddings, labels = self.arrays[stored]
        return MappedLoader(embeddings, labels, index, batch_size, shuffle, drop_last, seed, device)

    def train_loader(self, batch_size: int, drop_last: bool, seed: int, device, channels_last: bool = False):
        """Shuffled batches; epoch e is the (e+1)-th permutation of a generator seeded with ``seed``."""
        return self._loader("train", batch_size, True, drop_last, seed, device)

    def eval_loader(self, split: str, batch_size: int | None, device, channels_last: bool = False):
        """The split in its stored order."""
        return self._loader(split, batch_size, False, False, 0, device)

    def sizes(self) -> dict:
        return {split: len(index) for split, (_, index) in self.parts.items()}


class EmbeddingDataset:
    """Embeddings extracted by ``scripts/extract_embeddings.py`` (or converted from difftopk's files).

    Parameters
    ----------
    root : the extraction's output folder (classes.txt, train/, test/)
    name : the dataset's name in results
    holdout : int >= 1, training rows held out as the validation set (difftopk: 50,000 for ImageNet-1K,
        100,000 for ImageNet-21K-P), drawn as the first ``holdout`` of ``torch.randperm(N)`` from a
        generator seeded with ``split_seed`` (difftopk draws it from the training seed; equal for seed 0)
    split_seed : int, seed of the hold-out draw
    splits : {train: stored split, test: stored split}, the stored folders that give the training pool and
        the test set (the official validation images)
    task : embeddings (what the recipes key on: a head on precomputed embeddings)

    Examples
    --------
    >>> data = EmbeddingDataset("data/embeddings/imagenet1k_wsl_320", "imagenet1k", holdout=50_000).splits()  # doctest: +SKIP
    >>> data.sizes()  # doctest: +SKIP
    {'train': 1231167, 'val': 50000, 'test': 50000}
    """

    def __init__(
        self,
        root: str,
        name: str,
        holdout: int,
        split_seed: int = 0,
        splits: dict | None = None,
        task: str = "embeddings",
    ):
        if task != "embeddings":
            raise ValueError(f"task={task!r}: embedding datasets are 'embeddings' (multi-class labels)")
        check_int("dataset.holdout", holdout, why="training rows held out for validation")
        self.root, self.name, self.holdout, self.split_seed = Path(root), name, holdout, split_seed
        self.stored = dict(splits or {"train": "train", "test": "test"})
        if set(self.stored) != {"train", "test"}:
            raise ValueError(f"dataset.splits={self.stored} must map exactly train and test to stored splits")
        self.task = task

    def data_files(self) -> dict[str, Path]:
        """The class list and each stored split's embeddings and labels (:mod:`topklab.data.fingerprint`;
        hashed once per machine, the embeddings of ImageNet-21K-P being tens of GB)."""
        read_classes(self.root)  # no extraction here: its own one-line error, naming the make target
        splits = dict.fromkeys(self.stored.values())
        stored = {f"{split}.{name}": self.root / split / name for split in splits for name in (EMBEDDINGS, LABELS)}
        return {"classes": self.root / CLASSES, **stored}

    def splits(self) -> EmbeddingSplits:
        classes = read_classes(self.root)
        arrays = {}
        for stored in dict.fromkeys(self.stored.values()):
            embeddings, labels = open_split(self.root, stored, len(classes))
            arrays[stored] = (embeddings, torch.from_numpy(labels))
        dims = {stored: a[0].shape[1] for stored, a in arrays.items()}
        if len(set(dims.values())) > 1:
            raise TopklabError(
                f"{self.root}: the stored splits have different embedding sizes {dims}; extract them with one backbone"
            )
        pool = len(arrays[self.stored["train"]][1])
        if self.holdout >= pool:
            raise TopklabError(
                f"dataset.holdout={self.holdout} leaves no training rows of the {pool} in "
                f"{self.root / self.stored['train']}; lower it"
            )
        permutation = torch.randperm(pool, generator=torch.Generator().manual_seed(self.split_seed)).numpy()
        parts = {
            "train": (self.stored["train"], permutation[self.holdout :]),
            "val": (self.stored["train"], permutation[: self.holdout]),
            "test": (self.stored["test"], np.arange(len(arrays[self.stored["test"]][1]))),
        }
        info = {
            "split_seed": self.split_seed,
            "holdout": self.holdout,
            "classes": len(classes),
            "embedding_dim": int(next(iter(dims.values()))),
            "storage": str(arrays[self.stored["train"]][0].dtype),
            "sizes": {split: len(index) for split, (_, index) in parts.items()},
        }
        return EmbeddingSplits(
            self.name, len(classes), arrays, parts, info, {"val": sorted(parts["val"][1].tolist())}, task=self.task
        )
