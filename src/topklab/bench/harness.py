"""What the side-by-side benchmark scripts share: the device, a synchronised timer, and the result
envelope they write (``results/bench/<name>_<cpu|cuda>.json``)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import torch

from topklab.utils.errors import TopklabError


def bench_device(name: str) -> torch.device:
    """``torch.device(name)``; a one-line error when CUDA is asked for and none is visible."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TopklabError("--device cuda but no CUDA device is visible; use --device cpu")
    return device


def timed(call: Callable, device: torch.device):
    """``(seconds, call())``, synchronising a CUDA device before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def write_bench(root: Path, name: str, device: torch.device, rows: list[dict], config: dict, out: Path | None = None) -> Path:
    """Write ``rows`` (with the device, thread count and the command line) as a bench result envelope."""
    from topklab.report import make_result, write_result
    from topklab.utils.provenance import collect

    tag = "cuda" if device.type == "cuda" else "cpu"
    path = out or root / "results" / "bench" / f"{name}_{tag}.json"
    payload = {"rows": rows, "device": str(device), "threads": torch.get_num_threads(), **config}
    command = " ".join([f"python scripts/bench_{name}.py", *sys.argv[1:]])
    write_result(path, make_result("bench", f"{name}_{tag}", payload, command=command, config=config, provenance=collect(root)))
    return path
