"""Side by side: several candidates timed in turn within each repeat (so that load from elsewhere falls
on all of them alike), and their ratios to a baseline measured in the same run."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.harness.timing import median as statistics_median

Clock = Callable[[Callable], tuple[float, object]]  # call -> (seconds, what it returned)


def interleaved(
    candidates: dict[str, Callable],
    repeats: int,
    clock: Clock,
    warmup: int = 1,
    setup: dict[str, Callable] | None = None,
) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Time every candidate once per round, in order, for ``warmup + repeats`` rounds; the first
    ``warmup`` rounds are not kept. ``setup[name]()`` runs before each of that candidate's calls,
    outside the timer. Returns the kept seconds per candidate and what each one's last call returned."""
    setup = setup or {}
    times: dict[str, list[float]] = {name: [] for name in candidates}
    last: dict[str, object] = {}
    for round_ in range(warmup + repeats):
        for name, call in candidates.items():
            if name in setup:
                setup[name]()
            seconds, last[name] = clock(call)
            if round_ >= warmup:
                times[name].append(seconds)
    return times, last


def medians(times: dict[str, list[float]], median: Callable = statistics_median) -> dict[str, float]:
    return {name: median(values) for name, values in times.items()}


def ratios(values: dict[str, float], baseline: str) -> dict[str, float]:
    """Each value over the baseline's."""
    return {name: value / values[baseline] for name, value in values.items()}


def ratio_table(values: dict[str, float], baseline: str, unit: float = 1e3, unit_name: str = "ms") -> list[str]:
    """Markdown lines: each candidate's time (seconds × ``unit``) and its ratio to ``baseline``."""
    lines = [f"| candidate | time ({unit_name}) | vs {baseline} |", "|---|---|---|"]
    for name, ratio in ratios(values, baseline).items():
        lines.append(f"| {name} | {values[name] * unit:.3g} | {ratio:.2f} |")
    return lines
