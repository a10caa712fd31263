"""Timers of the benchmarks: one call (synchronised wall time, or CUDA events), repeats until a
minimum time, and the medians the scripts report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def is_cuda(device) -> bool:
    """Whether ``device`` (a ``torch.device`` or a name such as ``"cuda:0"``) is a CUDA device."""
    return str(device).startswith("cuda")


def timed(call: Callable, device) -> tuple[float, object]:
    """``(seconds, call())`` by the wall clock, synchronising a CUDA device before and after."""
    cuda = is_cuda(device)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


class Timer:
    """Seconds of one call: CUDA events around it on a GPU (then a synchronise), the wall clock on a CPU."""

    def __init__(self, device):
        self.cuda = is_cuda(device)

    def timed(self, call: Callable) -> tuple[float, object]:
        """``(seconds, call())``."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3, out
        began = time.perf_counter()
        out = call()
        return time.perf_counter() - began, out

    def once(self, call: Callable) -> float:
        return self.timed(call)[0]


def repeat_until(call: Callable, min_time: float, timer: Timer, min_repeats: int = 3) -> list[float]:
    """Seconds of repeated calls of ``call`` until they add up to ``min_time`` and there are at least
    ``min_repeats`` of them (warm-up is the caller's)."""
    times: list[float] = []
    total = 0.0
    while total < min_time or len(times) < min_repeats:
        seconds = timer.once(call)
        times.append(seconds)
        total += seconds
    return times


def upper_median(times: list[float]) -> float:
    """The middle of the sorted times; of the two middle ones the larger (an even count)."""
    ordered = sorted(times)
    return ordered[len(ordered) // 2]


def median(times: list[float]) -> float:
    """``statistics.median``: the mean of the two middle ones for an even count."""
    return statistics.median(times)
