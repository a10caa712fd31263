"""Readers of image datasets in their real on-disk formats: CIFAR-100's ``cifar-100-python``
pickles and the IDX files of (Fashion-)MNIST. Both return ``(images uint8 (N, C, H, W), labels int64)``."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

from topklab.utils.errors import DataUnavailableError, TopklabError

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"


def cifar100_missing_message(root: Path) -> str:
    return (
        f"CIFAR-100 is not at {root}/cifar-100-python (files train, test); download {CIFAR100_URL} "
        f"and extract it into {root}, or set dataset.download=true on a machine with a network"
    )


def ensure_cifar100(root: Path, download: bool) -> Path:
    """``root/cifar-100-python``, downloading torchvision's archive first when asked and missing."""
    folder = Path(root) / "cifar-100-python"
    if (folder / "train").is_file() and (folder / "test").is_file():
        return folder
    if download:
        from torchvision.datasets.utils import download_and_extract_archive

        try:
            download_and_extract_archive(CIFAR100_URL, str(root), md5=CIFAR100_MD5)
        except Exception as err:  # no network, proxy, checksum: all end in the same instruction
            raise DataUnavailableError(
                f"download failed ({type(err).__name__}: {err}); {cifar100_missing_message(root)}"
            ) from None
        return folder
    raise DataUnavailableError(cifar100_missing_message(root))


def read_cifar100_split(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One ``cifar-100-python`` pickle (``train`` or ``test``): images (N, 3, 32, 32) and fine labels."""
    try:
        with open(path, "rb") as handle:
            entry = pickle.load(handle, encoding="bytes")
        data = np.asarray(entry[b"data"], dtype=np.uint8)
        labels = np.asarray(entry[b"fine_labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise TopklabError(
            f"{path} is not a readable cifar-100-python file ({type(err).__name__}: {err}); delete it and download again"
        ) from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise TopklabError(
            f"{path}: data of shape {data.shape} with {len(labels)} labels is not CIFAR (N x 3072); delete it and download again"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 99):
        raise TopklabError(f"{path}: fine labels outside 0..99; the file is corrupt")
    return data.reshape(-1, 3, 32, 32), labels


IDX_MAGIC = {3: 2051, 1: 2049}  # images (N, H, W) and labels (N,)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file (gzip or plain) of unsigned bytes with ``ndim`` dimensions."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as err:
        raise TopklabError(f"{path} cannot be read ({err}); the file is corrupt, reinstall it") from None
    header = 4 + 4 * ndim
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic != IDX_MAGIC[ndim] or len(raw) < header:
        raise TopklabError(
            f"{path}: magic number {magic}, expected {IDX_MAGIC[ndim]} for a {ndim}-D uint8 IDX file; the file is corrupt"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) - header != int(np.prod(shape)):
        raise TopklabError(
            f"{path}: {len(raw) - header} bytes of data for shape {shape}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()


FASHION_MNIST_HINT = (
    "install Debian's dataset-fashion-mnist (`make data` unpacks it into .data/fashion-mnist; or "
    "`apt-get install dataset-fashion-mnist`), or put the four *-ubyte.gz files of "
    "https://github.com/zalandoresearch/fashion-mnist into dataset.root"
)


FASHION_MNIST_FILES = tuple(
    f"{split}-{kind}.gz" for split in ("train", "t10k") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
)


def find_fashion_mnist(candidates: list[Path]) -> Path:
    for folder in candidates:
        if all((Path(folder) / name).is_file() for name in FASHION_MNIST_FILES):
            return Path(folder)
    raise DataUnavailableError(f"Fashion-MNIST not found in {', '.join(map(str, candidates))}; {FASHION_MNIST_HINT}")


def read_fashion_mnist_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``split`` = train | t10k: images (N, 1, 28, 28) and labels."""
    images = read_idx(folder / f"{split}-images-idx3-ubyte.gz", 3)
    labels = read_idx(folder / f"{split}-labels-idx1-ubyte.gz", 1).astype(np.int64)
    if len(images) != len(labels):
        raise TopklabError(f"{folder}: {len(images)} {split} images but {len(labels)} labels; the files are corrupt")
    return images[:, None], labels
