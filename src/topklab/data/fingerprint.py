"""What data a run read: a content hash of the files its dataset reads, part of a result's identity and of
a checkpoint's, so that a run on other data (a label-shuffled copy under another ``paths.data_dir``)
neither replaces a stored result nor resumes a checkpoint silently.

A dataset names its files with ``data_files()``: ``{role: path}``, the role being what the file is to
the dataset (``train.de``, ``t10k-labels-idx1-ubyte.gz``), not where it is, so the same bytes at another
path give the same fingerprint. Every dataset that reads files names them: the IDX files of
Fashion-MNIST, CIFAR-100's pickles, a parallel corpus's text files or a hub corpus's Arrow files, a tabular
benchmark's file inside its package, an extraction's embeddings and labels, and the split lists and
class names of ImageNet-LT / Places-LT (the images those lists name are not hashed: a changed image
under an unchanged list is not seen). Generated data (``dataset=sinc``) names no file, and its
fingerprint is None: its config and seed are its identity.

A file of at most :data:`SMALL_FILE` bytes (label files, split lists, text corpora) is hashed each time
it is read. A larger one's SHA-256 is kept in ``<cache>/data_digests.json`` (:func:`cache_dir`) under
its resolved path with its size, inode, modification and status-change times: a rewrite in place,
even one at the same size whose modification time is restored (``cp -p``, ``rsync -a``, ``tar x``),
changes the status-change time, which no copy restores, so the digest is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from topklab.utils.errors import DataUnavailableError
from topklab.utils.io import atomic_write_json

DIGESTS_FILE = "data_digests.json"
CHUNK = 1 << 22
SMALL_FILE = 1 << 24  # bytes: files up to this size are hashed each time (16 MiB: about 30 ms)

DOCUMENTED_DATA = {  # the data a result stored before its fingerprint was recorded ran on, by dataset name
    "fmnist": "e608646a6e8893d6",  # Debian's dataset-fashion-mnist (`make data`): the four IDX files
    "fmnistlt": "e608646a6e8893d6",
    "multi30k": "fc37f77972666668",  # Multi30k task 1 de-en, test2016 (../shared/data/multi30k)
    "multi30k_en": "fdec03eddf14040f",  # its English side
}


def cache_dir() -> Path:
    """Where file digests are cached: ``TOPKLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/topklab``
    (``~/.cache/topklab``)."""
    if os.environ.get("TOPKLAB_CACHE_DIR"):
        return Path(os.environ["TOPKLAB_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topklab"


def _read_digests(path: Path) -> dict:
    try:
        digests = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return digests if isinstance(digests, dict) else {}


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def file_digests(paths: list[Path]) -> list[str]:
    """The SHA-256 of each file: computed for a small one (:data:`SMALL_FILE`), from the cache for a large
    one whose path, size, inode, modification and status-change times all match.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as handle:
    ...     file_digests([Path(handle.name)])[0][:12]
    'e3b0c44298fc'
    """
    cache = cache_dir() / DIGESTS_FILE
    digests, found, added = None, [], False
    for path in paths:
        stat = os.stat(path)
        if stat.st_size <= SMALL_FILE:
            found.append(_sha256(path))
            continue
        digests = _read_digests(cache) if digests is None else digests
        key = str(Path(path).resolve())
        status = {
            "size": stat.st_size,
            "inode": stat.st_ino,
            "mtime_ns": stat.st_mtime_ns,
            "ctime_ns": stat.st_ctime_ns,
        }
        entry = digests.get(key)
        if not (isinstance(entry, dict) and {k: entry.get(k) for k in status} == status and "sha256" in entry):
            entry = digests[key] = {**status, "sha256": _sha256(path)}
            added = True
        found.append(entry["sha256"])
    if added:
        try:
            atomic_write_json(cache, {**_read_digests(cache), **digests})
        except OSError:  # a read-only home: the digests are recomputed next time
            pass
    return found


def fingerprint(files: Mapping[str, str | os.PathLike]) -> str:
    """16 hex digits over each role and its file's content (where the files are does not count).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     (Path(folder) / "a.txt").write_text("x")
    ...     (Path(folder) / "b.txt").write_text("x")
    ...     fingerprint({"train": Path(folder) / "a.txt"}) == fingerprint({"train": Path(folder) / "b.txt"})
    1
    1
    True
    """
    roles = sorted(files)
    missing = [role for role in roles if not Path(files[role]).is_file()]
    if missing:
        raise DataUnavailableError(
            f"data file {files[missing[0]]} ({missing[0]}) not found; put the dataset's files there or point "
            "dataset.root (or paths.data_dir) at them"
        )
    digests = file_digests([Path(files[role]) for role in roles])
    text = "\n".join(f"{role}\0{digest}" for role, digest in zip(roles, digests, strict=True))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dataset_fingerprint(dataset) -> str | None:
    """The fingerprint of the files ``dataset`` (an instantiated ``dataset`` config) reads; None for
    a dataset that names none (no ``data_files``, or an empty mapping: generated data). A missing file
    is the dataset's own one-line error."""
    files = getattr(dataset, "data_files", None)
    named = {} if files is None else files()
    return fingerprint(named) if named else None
