"""The OLTR split lists of ImageNet-LT and Places-LT (Liu et al. 2019, as shipped by
classifier-balancing and LIFT): one ``relative/path label`` per line, plus ``classnames.txt``
(``<folder or WordNet id> <readable name>`` per line, in label order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from topklab.utils.errors import DataUnavailableError, TopklabError


def require_list(path: Path, where_from: str = "") -> Path:
    """``path``, or a one-line error naming where the list comes from (``where_from``) when it is missing."""
    if not path.is_file():
        raise DataUnavailableError(f"split list {path} not found" + (f"; {where_from}" if where_from else ""))
    return path


def read_split_list(path: Path, num_classes: int, where_from: str = "") -> tuple[list[str], np.ndarray]:
    """Relative image paths and int64 labels of one split list.

    Parameters
    ----------
    path : the list file
    num_classes : labels must lie in 0..num_classes−1
    where_from : appended to the missing-file error (where the user gets the list)

    Examples
    --------
    >>> import tempfile, os
    >>> listing = os.path.join(tempfile.mkdtemp(), "split.txt")
    >>> _ = open(listing, "w").write("train/a/1.jpg 0\\ntrain/b/2.jpg 1\\n")
    >>> read_split_list(Path(listing), num_classes=2)
    (['train/a/1.jpg', 'train/b/2.jpg'], array([0, 1]))
    """
    require_list(path, where_from)
    paths, labels = [], []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            relative, _, label = line.strip().rpartition(" ")
            if not relative or not label.lstrip("-").isdigit():
                raise TopklabError(f"{path}:{number}: expected 'relative/path label', got {line.strip()!r}")
            if not 0 <= int(label) < num_classes:
                raise TopklabError(
                    f"{path}:{number}: label {label} is outside 0..{num_classes - 1}; "
                    f"is this the list of another dataset?"
                )
            paths.append(relative)
            labels.append(int(label))
    if not paths:
        raise TopklabError(f"split list {path} is empty")
    return paths, np.asarray(labels, dtype=np.int64)


def read_classnames(path: Path, num_classes: int) -> list[str]:
    """Readable class names in label order (the second column on, with underscores as spaces)."""
    if not path.is_file():
        raise DataUnavailableError(f"class names {path} not found; it ships with the split lists (classnames.txt)")
    names = [line.strip().split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != num_classes or any(len(parts) != 2 for parts in names):
        raise TopklabError(f"{path} must hold {num_classes} lines '<id> <name>', got {len(names)}")
    return [parts[1].replace("_", " ") for parts in names]
