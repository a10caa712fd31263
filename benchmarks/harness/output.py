"""Writing what a benchmark measured, and drawing its table and plot from the stored result.

A benchmark's ``measure(args)`` returns :class:`Measured` values; the harness writes each as a ``bench``
result envelope, ``<out_dir>/<stem>.json``, then reads that file back and hands it to the benchmark's
``render(result)`` (the markdown, ``<stem>.md``) and ``plot(result, path)`` (``<stem>.png``) where the
benchmark has them. Table and plot are so a function of the stored file alone:
``python -m benchmarks render <file.json> …`` draws them again without measuring.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from topklab.report.outputs import write_outputs
from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_write_text


@dataclass
class Measured:
    """One result a benchmark measured, for the harness to write.

    Parameters
    ----------
    stem : the file name without suffix, e.g. ``"routing_cpu"``
    payload : what was measured (the envelope's ``result``): rows, ratios, the device
    settings : the options that determine the numbers (the envelope's ``config``; no machine paths)
    out_dir : the folder the files go to (``results/bench`` by default)
    command : the command line to record, when it must differ from the one run (a scratch folder left out)
    summary : the line printed last, after the files are written (a headline ratio or verdict)
    experiment : the result's name in its envelope when the file is named otherwise (``--out``); default ``stem``
    """

    stem: str
    payload: dict
    settings: dict
    out_dir: Path
    command: str | None = None
    summary: str = ""
    experiment: str | None = None


def draw(benchmark: ModuleType, path: Path) -> list[Path]:
    """``<stem>.md`` and ``<stem>.png`` beside the stored result ``path``, from that file alone, by the
    benchmark's ``render`` and ``plot`` (either may be absent; ``plot`` returns False when it has nothing
    to draw); returns the files written."""
    from topklab.report.schema import read_result

    result = read_result(path, "bench")
    written = []
    if hasattr(benchmark, "render"):
        text = benchmark.render(result)
        if text is not None:
            atomic_write_text(path.with_suffix(".md"), text)
            written.append(path.with_suffix(".md"))
    if hasattr(benchmark, "plot") and benchmark.plot(result, path.with_suffix(".png")):
        written.append(path.with_suffix(".png"))
    return written


def write_measured(benchmark: ModuleType, measured: Measured, command: str) -> list[Path]:
    """Write ``measured`` as ``<out_dir>/<stem>.json``, draw its table and plot from that file
    (:func:`draw`), print the files and ``measured.summary``; returns the files written."""
    path = write_outputs(
        measured.out_dir,
        measured.stem,
        measured.payload,
        measured.command or command,
        measured.settings,
        experiment=measured.experiment,
    )
    written = [path, *draw(benchmark, path)]
    print("wrote " + ", ".join(map(str, written)))
    if measured.summary:
        print(measured.summary)
    return written


def benchmark_of(result: dict) -> str:
    """The benchmark that wrote a stored result: the name after ``python -m benchmarks`` in its command.

    Examples
    --------
    >>> benchmark_of({"command": "python -m benchmarks routing --device cpu"})
    'routing'
    """
    words = result["command"].split()
    if words[:3] != ["python", "-m", "benchmarks"] or len(words) < 4:
        raise TopklabError(
            f"{result['command']!r} is not a `python -m benchmarks <name>` command; only those results can be redrawn"
        )
    return words[3]


def json_file(text: str) -> Path:
    """An ``--out`` option's value: a ``.json`` file (its table goes beside it), else argparse's error."""
    if not text.endswith(".json"):
        raise argparse.ArgumentTypeError(f"{text!r} is no .json file; name the result file, e.g. routing_cpu.json")
    return Path(text)


def device_tag(device) -> str:
    """A device's file-name tag: ``cuda`` for any CUDA device, else ``cpu``.

    Examples
    --------
    >>> device_tag("cuda:1"), device_tag(torch.device("cpu"))
    ('cuda', 'cpu')
    """
    return "cuda" if str(device).startswith("cuda") else "cpu"


def device_rows(
    root: Path,
    name: str,
    device: torch.device,
    rows: list[dict],
    config: dict,
    out: Path | None = None,
    summary: str = "",
) -> Measured:
    """The rows a device-bound benchmark measured, as ``results/bench/<name>_<cpu|cuda>.json`` under
    ``root`` (or the file ``out``): the payload is the rows with the device, the thread count and ``config``."""
    tag = device_tag(device)
    path = Path(out) if out else root / "results" / "bench" / f"{name}_{tag}.json"
    payload = {"rows": rows, "device": str(device), "threads": torch.get_num_threads(), **config}
    return Measured(path.stem, payload, config, path.parent, summary=summary, experiment=f"{name}_{tag}")
