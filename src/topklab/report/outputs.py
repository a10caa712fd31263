"""Writing a measured result: the result envelope (``topklab.report``) with the command line and the
provenance, a markdown table beside it and optionally a plot; and the label of the machine it ran on."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path


def script_command(script: str, argv: list[str] | None = None) -> str:
    """``python scripts/<script> <argv>`` (``argv``: default this process's arguments)."""
    return " ".join(["python", f"scripts/{script}", *(sys.argv[1:] if argv is None else argv)])


def write_outputs(
    out_dir: Path,
    stem: str,
    payload: dict,
    command: str,
    config: dict,
    markdown: str | None = None,
    plot: Callable[[Path], None] | None = None,
    root: Path | None = None,
    experiment: str | None = None,
) -> Path:
    """``<stem>.json`` (a ``bench`` result envelope, its ``experiment`` the stem unless given),
    ``<stem>.md`` if ``markdown`` is given, and ``plot(<stem>.png)`` if ``plot`` is, under ``out_dir``;
    returns the JSON's path. The provenance is that of the checkout ``root`` (default ``$TOPKLAB_ROOT``,
    else the working folder)."""
    from topklab.report import make_result, write_result
    from topklab.utils.io import atomic_write_text
    from topklab.utils.provenance import collect

    root = Path(root or os.environ.get("TOPKLAB_ROOT", "."))
    out_dir = Path(out_dir)
    path = out_dir / f"{stem}.json"
    envelope = make_result(
        "bench", experiment or stem, payload, command=command, config=config, provenance=collect(root)
    )
    write_result(path, envelope)
    if markdown is not None:
        atomic_write_text(out_dir / f"{stem}.md", markdown)
    if plot is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        plot(out_dir / f"{stem}.png")
    return path


def machine_label(device, threads: int | None = None, machine: dict | None = None) -> str:
    """The GPUs on CUDA; else the processor, its cores and (if given) the torch threads; of this machine,
    or of ``machine`` (a stored result's ``provenance.hardware``).

    Examples
    --------
    >>> machine_label("cpu", 1, {"processor": None, "machine": "x86_64", "cpu_count": 2, "gpus": []})
    'x86_64, 2 cores, 1 torch threads'
    """
    from topklab.utils.provenance import hardware

    machine = machine or hardware()
    if str(device).startswith("cuda"):
        return ", ".join(machine["gpus"])
    label = f"{machine.get('processor') or machine['machine']}, {machine['cpu_count']} cores"
    return label + ("" if threads is None else f", {threads} torch threads")
