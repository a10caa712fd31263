"""The benchmarks' harness: the timer's median of repeats, process isolation, the peak-RSS measure and
side-by-side ratios (no timed assertions: only bounds loose enough not to flake on a busy machine)."""

import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.harness import compare, timing
from benchmarks.harness.isolation import WorkerFailed, failure_line, run_isolated
from topklab.utils.errors import TopklabError

# ---------- workers for the isolation tests (run in a child process) ----------


def rows_worker(n: int, label: str = "x") -> list[dict]:
    return [{"i": i, "label": label} for i in range(n)]


def failing_worker() -> None:
    raise RuntimeError("the worker broke")


def topklab_error_worker() -> None:
    raise TopklabError("a one-line reason")


def test_repeat_until_runs_at_least_three_and_reaches_the_minimum_time():
    calls = []
    times = timing.repeat_until(lambda: calls.append(1), 0.0, timing.Timer("cpu"))
    assert len(times) == len(calls) == 3 and all(t >= 0 for t in times)
    times = timing.repeat_until(lambda: time.sleep(0.002), 0.02, timing.Timer("cpu"))
    assert len(times) >= 3 and sum(times) >= 0.02


def test_medians_follow_the_scripts_rules():
    assert timing.upper_median([4.0, 1.0, 3.0, 2.0]) == 3.0  # bench_topk: the larger middle one
    assert timing.median([4.0, 1.0, 3.0, 2.0]) == 2.5  # statistics.median
    assert timing.upper_median([5.0, 1.0, 3.0]) == timing.median([5.0, 1.0, 3.0]) == 3.0


def test_timed_returns_the_seconds_and_the_value():
    seconds, value = timing.timed(lambda: 7, "cpu")
    assert value == 7 and seconds >= 0
    assert timing.Timer("cpu").timed(lambda: "a")[1] == "a"


def test_isolated_worker_returns_its_rows():
    assert run_isolated("test_bench_harness:rows_worker", 2, label="y", env={"PYTHONPATH": _tests_path()}) == [
        {"i": 0, "label": "y"},
        {"i": 1, "label": "y"},
    ]


def test_a_failing_worker_is_one_error_line():
    with pytest.raises(WorkerFailed) as info:
        run_isolated("test_bench_harness:failing_worker", env={"PYTHONPATH": _tests_path()})
    assert str(info.value) == "RuntimeError: the worker broke" and info.value.returncode == 1
    with pytest.raises(WorkerFailed) as info:
        run_isolated("test_bench_harness:topklab_error_worker", env={"PYTHONPATH": _tests_path()})
    assert str(info.value) == "a one-line reason" and info.value.returncode == 2


def test_failure_line_without_stderr_names_the_exit():
    assert failure_line("", 3) == "exit 3"
    assert failure_line("  \n", -9) == "exit -9 (killed: out of memory?)"
    assert failure_line("Traceback\nValueError: bad\n\n", 1) == "ValueError: bad"


PEAK_RSS_CHECK = """
import numpy as np
import pytest
from benchmarks.harness import memory

memory.reset_peak_rss()
baseline = memory.current_rss_bytes()
block = np.ones(256 * 2**20 // 8)  # 256 MiB, every page touched
peak = memory.peak_rss_bytes() - baseline
del block
assert peak >= 200 * 2**20, peak
assert memory.max_rss_bytes() >= memory.peak_rss_bytes() - 2**20  # the lifetime peak is at least as high
assert memory.max_rss_mb() == pytest.approx(memory.max_rss_bytes() / 2**20)
print("ok")
"""


def test_peak_rss_sees_a_large_allocation():
    """In a fresh process: in a test process that freed large blocks before, the allocator may hand the
    256 MiB back from pages that are already resident, and the high-water mark rightly does not rise
    (it read 0 three times in a row in one worker of `make test`'s two)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_interleaved_identical_candidates_have_a_ratio_near_one():
    work = np.random.default_rng(0).standard_normal(200_000)
    candidates = {"a": lambda: float(np.sort(work)[0]), "b": lambda: float(np.sort(work)[0])}
    setups = []
    times, last = compare.interleaved(
        candidates, 5, timing.Timer("cpu").timed, warmup=1, setup={"b": lambda: setups.append(1)}
    )
    assert [len(v) for v in times.values()] == [5, 5] and last["a"] == last["b"] == float(work.min())
    assert len(setups) == 6  # before every call of b, the warm-up round's included
    ratio = compare.ratios(compare.medians(times), "a")
    assert ratio["a"] == 1.0 and 0.2 < ratio["b"] < 5
    table = compare.ratio_table(compare.medians(times), "a")
    assert table[0] == "| candidate | time (ms) | vs a |" and table[2].endswith("| 1.00 |") and len(table) == 4


def _tests_path() -> str:
    import os
    from pathlib import Path

    return os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
