"""The harness every benchmark runs under: the command line (``python -m benchmarks <name> …``, one
subcommand per benchmark module), the device check, the timers, process isolation, peak memory,
side-by-side ratios, and the writing and drawing of results. The pieces live in
:mod:`benchmarks.harness.timing`, :mod:`~benchmarks.harness.isolation`, :mod:`~benchmarks.harness.memory`,
:mod:`~benchmarks.harness.compare` and :mod:`~benchmarks.harness.output`.

A benchmark is a module of :mod:`benchmarks` that defines ``arguments(parser)`` (its options) and
``measure(args)``: what it measures, returned as :class:`~benchmarks.harness.output.Measured` values (or
an exit status where it writes nothing). Where it has them, ``render(result)`` gives its markdown table
and ``plot(result, path)`` draws its figure, both from the stored result alone. Its name on the command
line is the module's name; its help is its docstring. The harness gives ``measure`` the parsed options
plus ``args.command``, the command line as the result envelope records it (``python -m benchmarks <name>
…``), writes what it returns and draws the table and plot from the written file;
``python -m benchmarks render <file.json> …`` draws them again from stored results without measuring.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import torch

from benchmarks.harness.compare import interleaved, medians, ratio_table, ratios
from benchmarks.harness.isolation import WorkerFailed, project_root, run_isolated
from benchmarks.harness.memory import (
    cuda_peak_bytes,
    current_rss_bytes,
    max_rss_bytes,
    max_rss_mb,
    peak_rss_bytes,
    reset_cuda_peak,
    reset_peak_rss,
)
from benchmarks.harness.output import Measured, benchmark_of, device_rows, draw, write_measured
from benchmarks.harness.timing import Timer, median, repeat_until, timed, upper_median
from topklab.report.outputs import machine_label, write_outputs
from topklab.utils.errors import TopklabError

__all__ = [
    "Measured",
    "Timer",
    "TopklabError",
    "WorkerFailed",
    "bench_device",
    "benchmarks",
    "cuda_peak_bytes",
    "current_rss_bytes",
    "device_rows",
    "interleaved",
    "machine_label",
    "main",
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
    "write_outputs",
]

RENDER = "render"  # the harness's own subcommand: draw stored results again


def bench_device(name: str) -> torch.device:
    """``torch.device(name)``; a one-line error when CUDA is asked for and none is visible."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TopklabError("--device cuda but no CUDA device is visible; use --device cpu")
    return device


def benchmarks() -> dict[str, ModuleType]:
    """Every benchmark module of the package by its command-line name, in name order."""
    import benchmarks as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        if hasattr(module, "arguments") and hasattr(module, "measure"):
            found[info.name] = module
    return dict(sorted(found.items()))


def parser(registry: dict[str, ModuleType]) -> argparse.ArgumentParser:
    """``python -m benchmarks``'s parser: one subcommand per benchmark of ``registry``, and ``render``."""
    top = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run one benchmark; its results go to results/bench/ by default."
    )
    commands = top.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module in registry.items():
        doc = module.__doc__ or name
        sub = commands.add_parser(
            name,
            help=doc.split("\n\n")[0].replace("\n", " "),
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.arguments(sub)
    redraw = commands.add_parser(
        RENDER, help="draw the table (and plot) of stored results again, from the files alone; measures nothing"
    )
    redraw.add_argument("files", nargs="+", type=Path, help="result files a benchmark wrote (results/bench/*.json)")
    return top


def render_stored(files: list[Path], registry: dict[str, ModuleType]) -> int:
    """Draw each stored result's table and plot again beside it (:func:`~benchmarks.harness.output.draw`)."""
    from topklab.report.schema import read_result

    for path in files:
        if not path.is_file():
            raise TopklabError(f"{path} does not exist; pass a result file a benchmark wrote (results/bench/*.json)")
        name = benchmark_of(read_result(path, "bench"))
        if name not in registry:
            raise TopklabError(
                f"{path} was written by {name!r}, which is no benchmark here; choose from {', '.join(registry)}"
            )
        try:
            written = draw(registry[name], path)
        except KeyError as err:
            raise TopklabError(
                f"{path} lacks {err} that {name} draws from (an older result); measure it again with its command"
            ) from None
        print(f"{path}: " + (", ".join(map(str, written)) if written else f"{name} draws no table"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: this process's arguments), run the benchmark it names and write what it
    measured; a :class:`TopklabError` is one line on stderr and exit status 2."""
    os.environ.setdefault("TOPKLAB_ROOT", str(project_root()))
    argv = sys.argv[1:] if argv is None else list(argv)
    registry = benchmarks()
    args = parser(registry).parse_args(argv)
    name = args.__dict__.pop("benchmark")  # ``args``: the benchmark's own options and the command
    args.command = " ".join(["python -m benchmarks", *argv])
    try:
        if name == RENDER:
            return render_stored(args.files, registry)
        measured = registry[name].measure(args)
        if measured is None or isinstance(measured, int):
            return measured or 0
        for one in [measured] if isinstance(measured, Measured) else measured:
            write_measured(registry[name], one, args.command)
        return 0
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
