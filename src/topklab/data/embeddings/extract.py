"""Penultimate-layer embeddings of an image tree (``<split folder>/<class>/<image>``, the layout of
ImageNet-1K's ``train/`` and ``val/`` and of ImageNet-21K-P's ``imagenet21k_train/`` and
``imagenet21k_val/``) through a frozen :class:`~topklab.data.embeddings.Backbone`, written in
the layout of :mod:`topklab.data.embeddings.store`.

Images are processed in their sorted order and written shard by shard into a preallocated memory
map; a shard counts as done only once its rows are flushed and ``progress.json`` names it, so an
interrupted run resumes at the first unfinished shard (redoing at most one shard) and ends with the
same arrays as an uninterrupted one."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap
from tqdm import tqdm

from topklab.data.embeddings.backbone import Backbone
from topklab.data.embeddings.store import CLASSES, EMBEDDINGS, FILES, LABELS, PROGRESS, PROVENANCE, read_progress
from topklab.utils.checks import check_int
from topklab.utils.device import resolve_device
from topklab.utils.errors import DataUnavailableError, TopklabError
from topklab.utils.io import atomic_write_json, atomic_write_text

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def list_image_tree(folder: Path, classes: list[str] | None = None) -> tuple[list[str], np.ndarray, list[str]]:
    """``(files, labels, classes)`` of ``folder/<class>/<image>``: class folders sorted by name (the
    label is the class's position in ``classes``, or in the sorted folders when None), files sorted
    within a class, paths relative to ``folder``.

    Examples
    --------
    >>> list_image_tree(Path("imagenet/val"), ["n01440764", "n01443537"])  # doctest: +SKIP
    (['n01440764/ILSVRC2012_val_00000293.JPEG', ...], array([0, ...]), ['n01440764', 'n01443537'])
    """
    if not folder.is_dir():
        raise DataUnavailableError(
            f"{folder} is not a folder; the images must be laid out as <split folder>/<class>/<image> "
            f"(docs/imagenet.md)"
        )
    found = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not found:
        raise DataUnavailableError(f"{folder} has no class folders; expected {folder}/<class>/<image>")
    classes = found if classes is None else classes
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise TopklabError(
            f"{folder} has class folders the training split does not have ({', '.join(unknown[:3])}"
            f"{' …' if len(unknown) > 3 else ''}); both splits must share one class list"
        )
    index = {name: i for i, name in enumerate(classes)}
    files, labels = [], []
    for name in found:
        images = sorted(p.name for p in (folder / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        files += [f"{name}/{image}" for image in images]
        labels += [index[name]] * len(images)
    if not files:
        raise DataUnavailableError(f"{folder} holds no {'/'.join(IMAGE_SUFFIXES)} images")
    return files, np.asarray(labels, dtype=np.int64), classes


class TreeImages(torch.utils.data.Dataset):
    """Image ``i`` of ``root / files[i]`` as an RGB PIL image through ``transform``."""

    def __init__(self, root: Path, files: list[str], transform):
        self.root, self.files, self.transform = root, files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        from PIL import Image, UnidentifiedImageError

        path = self.root / self.files[index]
        try:
            with Image.open(path) as handle:
                return self.transform(handle.convert("RGB"))
        except (OSError, UnidentifiedImageError, ValueError) as err:
            raise TopklabError(
                f"image {path} cannot be read ({type(err).__name__}: {err}); replace or remove it, "
                f"then rerun (finished shards are kept)"
            ) from None


def one_line(err: BaseException) -> str:
    """The reason of an error re-raised from a DataLoader worker (its message ends with the worker's traceback)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__).split("TopklabError: ", 1)[-1]


def fingerprint(description: dict, files: list[str], shard_size: int) -> str:
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode())
    digest.update("\n".join(files).encode())
    digest.update(str(shard_size).encode())
    return digest.hexdigest()[:16]


def _start_split(
    out: Path, files: list[str], labels: np.ndarray, dim: int, storage: str, shard_size: int, key: str
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / FILES, "\n".join(files) + "\n")
    tmp = out / f".{LABELS}.tmp.npy"
    np.save(tmp, labels)
    tmp.replace(out / LABELS)
    open_memmap(out / EMBEDDINGS, mode="w+", dtype=storage, shape=(len(files), dim)).flush()
    state = {
        "fingerprint": key,
        "images": len(files),
        "shard_size": shard_size,
        "shards": math.ceil(len(files) / shard_size),
        "done": [],
        "complete": False,
    }
    atomic_write_json(out / PROGRESS, state)
    return state


def extract_split(
    model: torch.nn.Module,
    backbone: Backbone,
    transform,
    source: Path,
    files: list[str],
    labels: np.ndarray,
    out: Path,
    description: dict,
    batch_size: int,
    shard_size: int,
    num_workers: int,
    device: torch.device,
    progress: bool = True,
) -> dict:
    """Embed ``source / files`` into ``out`` (resuming its finished shards); returns
    ``{"images", "extracted", "seconds"}`` of this call."""
    key = fingerprint(description, files, shard_size)
    state = read_progress(out)
    if state is None or not (out / EMBEDDINGS).exists():
        state = _start_split(out, files, labels, description["embedding_dim"], backbone.storage, shard_size, key)
    elif state["fingerprint"] != key:
        raise TopklabError(
            f"{out} was started with another backbone, image list or shard size; delete {out} to start "
            f"over, or rerun with the settings it was started with"
        )
    if state["complete"]:
        return {"images": len(files), "extracted": 0, "seconds": 0.0}
    try:
        rows = open_memmap(out / EMBEDDINGS, mode="r+")
    except (ValueError, OSError) as err:
        raise TopklabError(
            f"{out / EMBEDDINGS} is corrupt ({err}); delete {out} and extract that split again"
        ) from None
    done = set(state["done"])
    todo = [s for s in range(state["shards"]) if s not in done]
    positions = [i for s in todo for i in range(s * shard_size, min((s + 1) * shard_size, len(files)))]
    loader = torch.utils.data.DataLoader(
        TreeImages(source, files, transform),
        batch_size=batch_size,
        sampler=positions,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    bar = tqdm(
        total=len(files),
        initial=len(files) - len(positions),
        unit="img",
        desc=f"{out.name} ({backbone.name})",
        disable=not progress,
        smoothing=0.05,
    )
    cursor, pending, start = 0, list(todo), time.perf_counter()
    try:
        with torch.no_grad(), backbone.autocast(device):
            for images in loader:
                features = model(images.to(device, non_blocking=True)).float().cpu().numpy()
                with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
                    features = features.astype(rows.dtype)
                if not np.isfinite(features).all():
                    first = positions[cursor + int(np.flatnonzero(~np.isfinite(features).all(axis=1))[0])]
                    raise TopklabError(
                        f"the backbone gave non-finite embeddings for {source / files[first]} "
                        f"(beyond {rows.dtype}'s range?); use backbone.storage=float32 or backbone.precision=fp32"
                    )
                rows[positions[cursor : cursor + len(features)]] = features
                cursor += len(features)
                bar.update(len(features))
                while pending and min((pending[0] + 1) * shard_size, len(files)) - 1 <= positions[cursor - 1]:
                    rows.flush()
                    state["done"].append(pending.pop(0))
                    atomic_write_json(out / PROGRESS, state)
    except TopklabError as err:  # from a worker, its message carries the worker's traceback
        raise type(err)(one_line(err)) from None
    finally:
        bar.close()
    state["complete"] = True
    atomic_write_json(out / PROGRESS, state)
    return {"images": len(files), "extracted": len(positions), "seconds": time.perf_counter() - start}


def extract(
    backbone: Backbone,
    image_root: str | Path,
    out_dir: str | Path,
    splits: dict[str, str],
    batch_size: int = 64,
    shard_size: int = 10_000,
    num_workers: int = 8,
    device: str = "auto",
    progress: bool = True,
    provenance: dict | None = None,
) -> dict:
    """Embed every split of ``splits`` (``{stored name: source folder under image_root}``, the
    training split ``train`` first: its class folders define the labels) into ``out_dir``.

    Returns ``{split: {"source", "images", "extracted", "seconds", "images_per_s"}}`` and writes it,
    with the backbone's description and ``provenance``, to ``out_dir/provenance.json``.
    """
    if "train" not in splits:
        raise TopklabError(f"splits={dict(splits)} must name a 'train' split (its class folders define the labels)")
    for name, value in (("batch_size", batch_size), ("shard_size", shard_size)):
        check_int(f"{name}", value, error=TopklabError)
    if num_workers < 0:
        raise TopklabError(f"num_workers={num_workers} must be >= 0")
    image_root, out_dir, device = Path(image_root), Path(out_dir), resolve_device(device)
    listings, classes = {}, None
    for name in ["train", *(s for s in splits if s != "train")]:
        files, labels, classes = list_image_tree(image_root / splits[name], classes)
        listings[name] = (files, labels)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / CLASSES).exists() and (out_dir / CLASSES).read_text().split() != classes:
        raise TopklabError(
            f"{out_dir / CLASSES} lists other classes than {image_root / splits['train']}; extract into a new out_dir"
        )
    atomic_write_text(out_dir / CLASSES, "\n".join(classes) + "\n")
    model = backbone.model(device)
    transform, description = backbone.transform(model), backbone.describe(model)
    report = {}
    for name, (files, labels) in listings.items():
        done = extract_split(
            model,
            backbone,
            transform,
            image_root / splits[name],
            files,
            labels,
            out_dir / name,
            description,
            batch_size,
            shard_size,
            num_workers,
            device,
            progress,
        )
        report[name] = {
            "source": splits[name],
            **done,
            "images_per_s": done["extracted"] / done["seconds"] if done["seconds"] else None,
        }
    atomic_write_json(
        out_dir / PROVENANCE,
        {
            "backbone": description,
            "classes": len(classes),
            "splits": report,
            "device": str(device),
            "batch_size": batch_size,
            "num_workers": num_workers,
            **(provenance or {}),
        },
    )
    return report
