"""What the benchmarks share, in one import: the device check, the timers, process isolation, peak
memory, side-by-side ratios and the result writer (``results/bench/<name>_<cpu|cuda>.json``).
The pieces live in :mod:`topklab.bench.timing`, :mod:`~topklab.bench.isolation`,
:mod:`~topklab.bench.memory`, :mod:`~topklab.bench.compare` and :mod:`~topklab.bench.output`."""

from __future__ import annotations

import torch

from topklab.bench.compare import interleaved, medians, ratio_table, ratios
from topklab.bench.isolation import WorkerFailed, project_root, run_isolated
from topklab.bench.memory import (
    cuda_peak_bytes,
    current_rss_bytes,
    max_rss_bytes,
    max_rss_mb,
    peak_rss_bytes,
    reset_cuda_peak,
    reset_peak_rss,
)
from topklab.bench.output import command_line, machine_label, write_bench, write_outputs
from topklab.bench.timing import Timer, median, repeat_until, timed, upper_median
from topklab.utils.errors import TopklabError

__all__ = [
    "Timer",
    "TopklabError",
    "WorkerFailed",
    "bench_device",
    "command_line",
    "cuda_peak_bytes",
    "current_rss_bytes",
    "interleaved",
    "machine_label",
    "max_rss_bytes",
    "max_rss_mb",
    "median",
    "medians",
    "peak_rss_bytes",
    "project_root",
    "ratio_table",
    "ratios",
    "repeat_until",
    "reset_cuda_peak",
    "reset_peak_rss",
    "run_isolated",
    "timed",
    "upper_median",
    "write_bench",
    "write_outputs",
]


def bench_device(name: str) -> torch.device:
    """``torch.device(name)``; a one-line error when CUDA is asked for and none is visible."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TopklabError("--device cuda but no CUDA device is visible; use --device cpu")
    return device
