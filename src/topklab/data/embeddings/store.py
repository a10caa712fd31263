"""The on-disk layout of extracted embeddings, shared by the extractor and the dataset::

    <root>/classes.txt                 one class id (wnid) per line; line i is label i
    <root>/provenance.json             backbone, preprocessing, code version, hardware, throughput
    <root>/<split>/embeddings.npy      (N, D) float16 (or float32), a NumPy array file read as a memory map
    <root>/<split>/labels.npy          (N,) int64
    <root>/<split>/files.txt           the N image paths, relative to the split's source folder
    <root>/<split>/progress.json       extraction state: shard size, finished shards, ``complete``

A split is usable once its ``progress.json`` says ``complete`` (or has none: arrays written by a
converter in one go)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from topklab.utils.errors import DataUnavailableError, TopklabError

EMBEDDINGS, LABELS, FILES, PROGRESS, CLASSES, PROVENANCE = (
    "embeddings.npy",
    "labels.npy",
    "files.txt",
    "progress.json",
    "classes.txt",
    "provenance.json",
)
STORAGE_DTYPES = ("float16", "float32")


def read_classes(root: Path) -> list[str]:
    path = root / CLASSES
    if not path.exists():
        raise DataUnavailableError(
            f"no embeddings at {root} ({CLASSES} missing); extract them first "
            f"(docs/imagenet.md: make extract-embeddings-...)"
        )
    return path.read_text().split()


def read_progress(split_dir: Path) -> dict | None:
    path = split_dir / PROGRESS
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise TopklabError(f"{path} is corrupt ({err}); delete {split_dir} and extract that split again") from None


def open_split(root: Path, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings as a read-only memory map, labels) of one finished split, checked: 2-D float
    embeddings, one int label per row, every label in [0, num_classes)."""
    split_dir = root / split
    progress = read_progress(split_dir)
    if progress is not None and not progress.get("complete"):
        raise TopklabError(
            f"embeddings of {split_dir} are incomplete ({len(progress['done'])} of {progress['shards']} "
            f"shards); rerun the extraction command to finish them"
        )
    for name in (EMBEDDINGS, LABELS):
        if not (split_dir / name).exists():
            raise DataUnavailableError(
                f"{split_dir / name} is missing; extract the {split!r} split first (docs/imagenet.md)"
            )
    try:
        embeddings = np.load(split_dir / EMBEDDINGS, mmap_mode="r")
        labels = np.load(split_dir / LABELS)
    except (ValueError, OSError, EOFError) as err:
        raise TopklabError(
            f"{split_dir} holds a corrupt array ({err}); delete it and extract that split again"
        ) from None
    if embeddings.ndim != 2 or embeddings.dtype.name not in STORAGE_DTYPES:
        raise TopklabError(
            f"{split_dir / EMBEDDINGS} must be a 2-D float16/float32 array, "
            f"found shape {embeddings.shape} of {embeddings.dtype}"
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise TopklabError(
            f"{split_dir / LABELS} must be a 1-D integer array, found shape {labels.shape} of {labels.dtype}"
        )
    if len(labels) != len(embeddings):
        raise TopklabError(
            f"{split_dir}: {len(embeddings)} embeddings but {len(labels)} labels; "
            f"they must have one label per row (extract the split again)"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels.min() if labels.min() < 0 else labels.max())
        raise TopklabError(
            f"{split_dir / LABELS}: class index {bad} is out of range for the {num_classes} classes of {root / CLASSES}"
        )
    return embeddings, labels.astype(np.int64, copy=False)
