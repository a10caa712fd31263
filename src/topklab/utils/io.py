"""Atomic writes: a reader never sees a half-written result file."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would hide results from other users
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if _disk_full(err):
            from topklab.utils.errors import TopklabError

            raise TopklabError(
                f"no space left on the device of {path.parent} ({shutil.disk_usage(path.parent).free:,} "
                f"bytes free) while writing {path.name}; free some, or point paths.* elsewhere"
            ) from None
        raise
    return path


def _disk_full(err: BaseException) -> bool:
    """A write that failed for want of space: ENOSPC, or torch.save's zip writer reporting a short write."""
    if isinstance(err, OSError):
        return err.errno == errno.ENOSPC
    return isinstance(err, RuntimeError) and ("unexpected pos" in str(err) or "file write failed" in str(err))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return _atomic(path, lambda handle: handle.write(text), "w")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    return _atomic(path, lambda handle: torch.save(obj, handle), "wb")


MIN_FREE_BYTES = 1 << 20  # a device with less free space than this is full for a run's record and checkpoints


def _require_room(folder: Path, unwritable, full, create: bool = False) -> None:
    """Write and remove a scratch file in ``folder`` (created first with ``create``) and check its
    device's free space; a one-line :class:`~topklab.utils.errors.TopklabError` otherwise, worded by
    ``unwritable(reason)`` or ``full(free_bytes)``."""
    from topklab.utils.errors import TopklabError

    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        free = shutil.disk_usage(folder).free
    except OSError as err:
        raise TopklabError(unwritable(err.strerror or err)) from None
    if free < MIN_FREE_BYTES:
        raise TopklabError(full(free))


def check_writable(folders: list[tuple[Path, str]]) -> None:
    """Create each folder and a scratch file in it, before any work is done there; a folder that
    cannot take one, or whose device is full, is a one-line :class:`~topklab.utils.errors.TopklabError`
    naming the setting."""
    for folder, setting in folders:
        _require_room(
            Path(folder),
            lambda reason, folder=folder, setting=setting: (
                f"cannot write to {folder} ({reason}); make it writable or choose another {setting}"
            ),
            lambda free, folder=folder, setting=setting: (
                f"no space left on the device of {folder} ({free:,} bytes free); free some, or choose another {setting}"
            ),
            create=True,
        )


def check_creatable(folder: str | os.PathLike, what: str, setting: str) -> None:
    """``folder`` (``what``: its name in the message) can be created and written: its nearest
    existing ancestor is a folder that takes a file and whose device is not full. Nothing is left
    behind (for a folder whose name is only fixed later, such as Hydra's timestamped run directory).
    A failure is a one-line :class:`~topklab.utils.errors.TopklabError` naming ``setting``."""
    from topklab.utils.errors import TopklabError

    folder = Path(folder).absolute()
    existing = folder
    try:
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise TopklabError(
                f"cannot create {what} {folder}: {existing} is a file, not a folder; choose another {setting}"
            )
    except OSError as err:
        raise TopklabError(
            f"cannot create {what} {folder}: {existing} cannot be read ({err.strerror or err}); "
            f"choose another {setting}"
        ) from None
    _require_room(
        existing,
        lambda reason: (
            f"cannot create {what} {folder}: {existing} is not writable ({reason}); make it writable "
            f"or choose another {setting}"
        ),
        lambda free: (
            f"cannot create {what} {folder}: no space left on the device of {existing} ({free:,} bytes "
            f"free); free some, or choose another {setting}"
        ),
    )
