"""Where STk's and MATk's training calls synchronise with the host on CUDA (the 2026-11-27 H200 check): for a few
seeds, 120 calls of a fresh module on one batch of 1e5 uniform losses after its first call, under
``set_sync_debug_mode("warn")``; each synchronising warning is printed with the call's index and the
Python stack that raised it, then the λ monitor's band counts. Run from the repository root:
``PYTHONPATH=src python3 experiments/device_runs/h200_2026-11-27_sync_sites/sync_sites.py``."""

import traceback
import warnings

import torch

from topklab.losses import MATk, STk

SYNC = "called a synchronizing CUDA operation"


def sync_sites(build, seed: int, calls: int = 120) -> list[tuple[int, str]]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    module = build().cuda()
    x = torch.rand(100_000, device="cuda", generator=generator).requires_grad_(True)
    module(x).backward()
    torch.cuda.synchronize()
    sites, call = [], [0]

    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC in str(message):
            sites.append((call[0], "".join(traceback.format_stack(limit=9)[:-1])))
        else:
            sites.append((call[0], f"other warning: {str(message)[:200]}"))

    saved = warnings.showwarning
    warnings.showwarning = show
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for index in range(calls):
                call[0] = index + 2
                module(x).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = saved
    band = {key: value for key, value in module.monitor.pop_epoch().items() if "band" in key or "calls" in key}
    print(f"{type(module).__name__} seed {seed}: λ {float(module.threshold):.6f}, {band}")
    return sites


for name, build in [("STk", lambda: STk(k=0.1)), ("MATk", lambda: MATk(k=0.1))]:
    for seed in range(6):
        for call, where in sync_sites(build, seed):
            print(f"  {name} seed {seed} call {call}:\n{where}")
