"""Writing a benchmark's rows as ``results/bench/<name>_<cpu|cuda>.json``; the envelope writer and the
machine label are the package's (:mod:`topklab.report.outputs`)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_bench(
    root: Path, name: str, device: torch.device, rows: list[dict], config: dict, command: str, out: Path | None = None
) -> Path:
    """Write ``rows`` (with the device, thread count and the command line) as a bench result envelope,
    ``results/bench/<name>_<cpu|cuda>.json`` under ``root`` unless ``out`` names the file."""
    from topklab.report import make_result, write_result
    from topklab.utils.provenance import collect

    tag = "cuda" if device.type == "cuda" else "cpu"
    path = out or root / "results" / "bench" / f"{name}_{tag}.json"
    payload = {"rows": rows, "device": str(device), "threads": torch.get_num_threads(), **config}
    write_result(
        path, make_result("bench", f"{name}_{tag}", payload, command=command, config=config, provenance=collect(root))
    )
    return path
