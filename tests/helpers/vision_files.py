"""Tiny image datasets written in their real on-disk formats, for offline tests."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray) -> None:
    magic = 2051 if array.ndim == 3 else 2049
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def class_images(rng, labels: np.ndarray, shape) -> np.ndarray:
    """Learnable images: a class-dependent bright square on noise."""
    images = rng.integers(0, 60, size=(len(labels), *shape), dtype=np.uint8)
    for i, c in enumerate(labels):
        row, col = divmod(int(c) % 16, 4)
        images[i, ..., 2 + 5 * row : 6 + 5 * row, 2 + 5 * col : 6 + 5 * col] = 255
    return images


def write_fashion_mnist(root: Path, per_class_train: int = 60, per_class_test: int = 10, seed: int = 0) -> Path:
    """The four ``*-ubyte.gz`` IDX files of a 10-class, 28×28 set under ``root``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, per_class in (("train", per_class_train), ("t10k", per_class_test)):
        labels = rng.permutation(np.repeat(np.arange(10), per_class))
        write_idx(root / f"{split}-images-idx3-ubyte.gz", class_images(rng, labels, (28, 28)))
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)
    return root


def write_cifar100(root: Path, per_class_train: int = 6, per_class_test: int = 1, seed: int = 0) -> Path:
    """``root/cifar-100-python/{train,test}`` pickles in torchvision's format (100 classes, 32×32×3)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for split, per_class in (("train", per_class_train), ("test", per_class_test)):
        labels = rng.permutation(np.repeat(np.arange(100), per_class))
        images = class_images(rng, labels, (3, 32, 32)).reshape(len(labels), -1)
        entry = {
            b"filenames": [b"x.png"] * len(labels),
            b"batch_label": split.encode(),
            b"fine_labels": labels.tolist(),
            b"coarse_labels": (labels // 5).tolist(),
            b"data": images,
        }
        with open(folder / split, "wb") as handle:
            pickle.dump(entry, handle)
    return root


def write_tree(base, per_class=(6, 3, 1), size=40):
    """<base>/images/{train,val}/<class>/<n>.jpg and <base>/lists/Tiny_{train,val,test}.txt + classnames.txt."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images, lists = base / "images", base / "lists"
    lists.mkdir(parents=True)
    rows = {"train": [], "val": [], "test": []}
    for label, count in enumerate(per_class):
        for split, n, folder in (("train", count, "train"), ("val", 2, "train"), ("test", 2, "val")):
            for i in range(n):
                relative = f"{folder}/class_{label}/{split}{i}.jpg"
                (images / relative).parent.mkdir(parents=True, exist_ok=True)
                pixels = rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(images / relative, quality=90)
                rows[split].append(f"{relative} {label}")
    for split, lines in rows.items():
        (lists / f"Tiny_{split}.txt").write_text("\n".join(lines) + "\n")
    (lists / "classnames.txt").write_text("".join(f"class_{c} class_{c}_name\n" for c in range(len(per_class))))
    return images, lists


def tiny_listed(images, lists, **kwargs):
    """A ListedImageDataset over :func:`write_tree`'s images and lists (3 classes, 16 px, no workers)."""
    from topklab.data.vision import ListedImageDataset

    return ListedImageDataset(
        name="tiny_lt",
        root=str(images),
        split_dir=str(lists),
        num_classes=3,
        lists={s: f"Tiny_{s}.txt" for s in ("train", "val", "test")},
        **{"resolution": 16, "num_workers": 0, **kwargs},
    )
