"""One GPU per sweep job.

A sweep run on this machine (the basic, joblib or submitit_local launcher) gives each job one GPU:
job ``n`` gets device ``n mod G`` of the configured GPUs (``hydra.callbacks.jobs.gpus``) or, when
none are configured, of the G devices the sweep's process sees. The device is exported as
``CUDA_VISIBLE_DEVICES`` before CUDA is initialised, so the job sees it as ``cuda:0``.

A process is pinned once: CUDA reads ``CUDA_VISIBLE_DEVICES`` when it starts, so a joblib worker
that runs several jobs keeps the GPU of its first. Each pinned process also holds a lock on its
device for as long as it lives; a job whose device is held by another running process takes a
free one, so n_jobs = G workers always hold G different GPUs.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from topklab.utils.errors import TopklabError

PINNED = "TOPKLAB_GPU"  # the device this process is pinned to, as CUDA_VISIBLE_DEVICES names it
SWEEP_GPUS = "TOPKLAB_SWEEP_GPUS"  # the sweep's devices, set by the sweep's process for its jobs
_SLOT: dict = {}  # this process's pin: {"device": str, "lock": fd or None}


def gpu_list(configured) -> list[str] | None:
    """A configured list of GPUs (ids or UUIDs as CUDA_VISIBLE_DEVICES takes them) as strings;
    None when none is configured."""
    if configured is None:
        return None
    if isinstance(configured, (str, int)) or not len(configured):
        raise TopklabError(
            f"gpus={configured!r} must be a non-empty list of GPU ids, e.g. gpus=[0,2]; null uses every visible GPU"
        )
    devices = [str(d).strip() for d in configured]
    if "" in devices or len(set(devices)) != len(devices):
        raise TopklabError(f"gpus={list(configured)!r} must list distinct GPU ids, e.g. gpus=[0,2]")
    return devices


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when it is set, else every device
    torch counts (through NVML, which does not initialise CUDA)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_for_job(job_num: int, visible: Sequence[str], configured: Sequence[str] | None = None) -> str | None:
    """The GPU of sweep job ``job_num``: round robin over the configured list, else over the visible
    devices; None when there is no GPU."""
    devices = list(configured or visible)
    return devices[job_num % len(devices)] if devices else None


def parallel_jobs(configured=None) -> int:
    """joblib's ``n_jobs`` on this machine: one job per GPU (configured, else visible), or -1 (one
    per CPU core) without GPUs. The ``topklab.parallel_jobs`` resolver of hydra/launcher/joblib."""
    return len(gpu_list(configured) or visible_gpus()) or -1


def pin_gpu(device: str, devices: Sequence[str], lock_dir: Path) -> str | None:
    """Pin this process to ``device`` (or, when another live process holds it, to the next free one
    of ``devices``) by setting ``CUDA_VISIBLE_DEVICES``; return the device it is pinned to.

    A process already pinned keeps its device; one that has already initialised CUDA can no longer
    be pinned (None). With more processes than devices, the extra ones share ``device``."""
    if _SLOT:
        return _SLOT["device"]
    import torch

    if torch.cuda.is_initialized():
        return None
    lock_dir.mkdir(parents=True, exist_ok=True)
    start, lock = list(devices).index(device), None
    for candidate in [*devices[start:], *devices[:start]]:
        lock = _try_lock(lock_dir / f"gpu-{candidate.replace('/', '_')}.lock")
        if lock is not None:
            device = candidate
            break
    _SLOT.update(device=device, lock=lock)
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[PINNED] = device
    return device


def pinned_gpu() -> str | None:
    """The GPU this process was pinned to (as CUDA_VISIBLE_DEVICES names it), None if not pinned."""
    return os.environ.get(PINNED) or None


def _try_lock(path: Path) -> int | None:
    """An exclusive lock on ``path`` held until this process exits, or None if another holds it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
