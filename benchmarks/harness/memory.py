"""Peak memory of a measurement: the process's resident-set high-water mark from /proc (resettable,
Linux >= 4.0), the lifetime peak from ``getrusage``, and CUDA's ``max_memory_allocated``."""

from __future__ import annotations

import os
import resource

import torch


def current_rss_bytes() -> int:
    """This process's resident size now."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's RSS (Linux >= 4.0) to its RSS now."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_rss_bytes() -> int:
    """The high-water mark of this process's RSS since it started or since :func:`reset_peak_rss`."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def max_rss_bytes() -> int:
    """The largest resident size this process has had (``getrusage``; not reset by :func:`reset_peak_rss`
    on every kernel, so the benchmarks that report it use it as a lifetime peak)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def max_rss_mb() -> float:
    """:func:`max_rss_bytes` in MiB (``ru_maxrss`` / 1024)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_cuda_peak(device=None) -> None:
    torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_bytes(device=None) -> int:
    """``torch.cuda.max_memory_allocated`` since the last :func:`reset_cuda_peak`."""
    return torch.cuda.max_memory_allocated(device)
