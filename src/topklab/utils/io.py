"""Atomic writes: a reader never sees a half-written result file."""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


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

            raise TopklabError(f"no space left on the device of {path.parent} ({shutil.disk_usage(path.parent).free:,} "
                               f"bytes free) while writing {path.name}; free some, or point paths.* elsewhere") from None
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


def check_writable(folders: list[tuple[Path, str]]) -> None:
    """Create each folder and a scratch file in it, before any work is done there; a folder that
    cannot take one is a one-line :class:`~topklab.utils.errors.TopklabError` naming the setting."""
    from topklab.utils.errors import TopklabError

    for folder, setting in folders:
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise TopklabError(f"cannot write to {folder} ({err.strerror or err}); make it writable or choose "
                               f"another {setting}") from None
