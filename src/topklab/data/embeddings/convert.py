"""difftopk's published embedding files (``ImageNet_embeddings_labels_train_test_*.p``, ``torch.save``
of a dict of tensors; README of github.com/Felix-Petersen/difftopk) into the layout of
:mod:`topklab.data.embeddings.store`, so Petersen et al.'s tables can be rerun from them without the
images. Three key layouts exist: ``{train,test}_{embeddings,labels}`` (ResNeXt-101 WSL, ImageNet-1K),
``imagenet21k_{train,val}_*`` (ImageNet-21K-P) and ``{train,val}_*`` (EfficientNet-L2)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap

from topklab.data.embeddings.store import CLASSES, EMBEDDINGS, FILES, LABELS, STORAGE_DTYPES
from topklab.utils.errors import DataUnavailableError, TopklabError
from topklab.utils.io import atomic_write_json, atomic_write_text

LAYOUTS = {  # stored split: (embeddings key, labels key), per layout of difftopk's files
    "wsl_1k": {"train": ("train_embeddings", "train_labels"), "test": ("test_embeddings", "test_labels")},
    "imagenet21k_p": {
        "train": ("imagenet21k_train_embeddings", "imagenet21k_train_labels"),
        "test": ("imagenet21k_val_embeddings", "imagenet21k_val_labels"),
    },
    "efficientnet_l2": {"train": ("train_embeddings", "train_labels"), "test": ("val_embeddings", "val_labels")},
}


def convert_difftopk(path: str | Path, out_dir: str | Path, storage: str | None = None, chunk: int = 100_000) -> dict:
    """Write ``path``'s train and test embeddings to ``out_dir`` (``train/``, ``test/``, ``classes.txt``
    naming the classes 0 … C−1, C = the largest label + 1 as in difftopk). ``storage``: float16 |
    float32, or None to keep the file's dtype. Returns ``{split: rows}``."""
    path, out_dir = Path(path), Path(out_dir)
    if not path.is_file():
        raise DataUnavailableError(f"{path} does not exist; download it from difftopk's README")
    if storage is not None and storage not in STORAGE_DTYPES:
        raise TopklabError(f"storage={storage!r}; choose one of {', '.join(STORAGE_DTYPES)} or leave it out")
    try:  # memory-mapped: the 11-50 GB files need not fit in memory
        data = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, OSError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise TopklabError(
            f"{path} is not a readable torch file ({type(err).__name__}: {str(err)[:120]}); download it again"
        ) from None
    if not isinstance(data, dict):
        raise TopklabError(f"{path} holds a {type(data).__name__}, not difftopk's dict of tensors")
    layout = next(
        (name for name, keys in LAYOUTS.items() if all(k in data for pair in keys.values() for k in pair)), None
    )
    if layout is None:
        raise TopklabError(
            f"{path} has keys {sorted(data)[:8]}, none of difftopk's layouts "
            f"({'; '.join(f'{n}: {sorted(k for p in v.values() for k in p)}' for n, v in LAYOUTS.items())})"
        )
    labels = {split: data[keys[1]].numpy().astype(np.int64) for split, keys in LAYOUTS[layout].items()}
    classes = int(max(int(v.max()) for v in labels.values())) + 1
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = {}
    for split, (embedding_key, _) in LAYOUTS[layout].items():
        source = data[embedding_key]
        if source.dim() != 2 or len(source) != len(labels[split]):
            raise TopklabError(
                f"{path}: {embedding_key} has shape {tuple(source.shape)} for {len(labels[split])} labels"
            )
        dtype = storage or ("float16" if source.dtype == torch.float16 else "float32")
        folder = out_dir / split
        folder.mkdir(exist_ok=True)
        target = open_memmap(folder / EMBEDDINGS, mode="w+", dtype=dtype, shape=tuple(source.shape))
        for start in range(0, len(source), chunk):
            target[start : start + chunk] = source[start : start + chunk].float().numpy()
        target.flush()
        np.save(folder / LABELS, labels[split])
        atomic_write_text(
            folder / FILES, f"# rows of {path.name}:{embedding_key}; image paths not recorded by difftopk\n"
        )
        rows[split] = len(source)
    atomic_write_text(out_dir / CLASSES, "\n".join(str(c) for c in range(classes)) + "\n")
    atomic_write_json(
        out_dir / "provenance.json", {"converted_from": path.name, "layout": layout, "rows": rows, "classes": classes}
    )
    return rows
