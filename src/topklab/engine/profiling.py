"""Per-epoch cost figures of a training loop: step time, images/s, the share of time spent
waiting for data, the share spent in the loss, and peak memory. ``images_per_s`` counts samples
(sentences in translation), ``losses_per_s`` the per-sample losses the aggregate saw (target tokens). On CUDA, regions are timed with
events and read once per epoch (no synchronisation inside the step)."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from pathlib import Path

import torch

from topklab.utils.errors import TopklabError


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA ``max_memory_allocated`` on a GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class StepProfile:
    """Accumulates region times of the steps of one epoch.

    Take clock readings with :meth:`now` (CUDA events on a GPU, ``perf_counter`` on CPU) where a
    step's compute starts, where its loss starts and ends (once per micro-batch), and after the
    optimizer step, and hand them with the seconds spent waiting for the batch to :meth:`step`.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.wait = 0.0
        self.images = 0
        self.losses = 0
        self.steps = 0
        self._events: list[tuple] = []
        self._cpu_loss = 0.0
        self._cpu_compute = 0.0
        self._start = time.perf_counter()

    def now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def step(
        self,
        fetched_after: float,
        loss_spans: list[tuple],
        compute_start,
        compute_end,
        images: int,
        losses: int | None = None,
    ) -> None:
        self.wait += fetched_after
        self.images += images
        self.losses += images if losses is None else losses
        self.steps += 1
        if self.cuda:
            self._events.append((list(loss_spans), compute_start, compute_end))
        else:
            self._cpu_loss += sum(end - start for start, end in loss_spans)
            self._cpu_compute += compute_end - compute_start

    def summary(self) -> dict:
        elapsed = time.perf_counter() - self._start
        if self.cuda:
            torch.cuda.synchronize()
            loss = sum(a.elapsed_time(b) for spans, _, _ in self._events for a, b in spans) / 1e3
            compute = sum(c.elapsed_time(d) for _, c, d in self._events) / 1e3
        else:
            loss, compute = self._cpu_loss, self._cpu_compute
        steps = max(self.steps, 1)
        return {
            "step_time_s": elapsed / steps,
            "images_per_s": self.images / elapsed if elapsed > 0 else 0.0,
            "losses_per_s": self.losses / elapsed if elapsed > 0 else 0.0,
            "data_wait_share": self.wait / elapsed if elapsed > 0 else 0.0,
            "loss_share": loss / compute if compute > 0 else 0.0,
        }


class _NoProfiler(contextlib.nullcontext):
    def step(self) -> None:
        pass


def torch_profiler(settings: dict, run_dir):
    """``torch.profiler.profile`` over the steps ``settings`` (enabled, wait, warmup, active) name,
    writing a Chrome trace to ``<run_dir>/profile/trace.json``; a no-op context when disabled."""
    if not settings["enabled"]:
        return _NoProfiler()
    if run_dir is None:
        raise TopklabError("engine.profiler.enabled needs a run directory for the trace")
    trace = Path(run_dir) / "profile" / "trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        record_shapes=True,
        profile_memory=True,
        schedule=torch.profiler.schedule(
            wait=settings["wait"], warmup=settings["warmup"], active=settings["active"], repeat=1
        ),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace)),
    )
