"""Where STk's and MATk's calls synchronise with the host on CUDA (the 2026-11-27 H200 check, call 2): the warnings
120 calls of each default aggregate raise under ``set_sync_debug_mode("warn")``, then, on a fresh
module, the stack of each call that synchronises under ``"error"``. Run from the repository root with
``src`` on the path: ``python3 experiments/device_runs/h200_2026-11-27_operators/sync_where.py``."""

import traceback
import warnings

import torch

from topklab.losses import ATk, MATk, STk
from topklab.losses.aggregate import Average

for name, build in [
    ("Average", Average),
    ("ATk", lambda: ATk(k=0.1)),
    ("STk", lambda: STk(k=0.1)),
    ("MATk", lambda: MATk(k=0.1)),
]:
    module = build().cuda()
    x = torch.rand(100_000, device="cuda", requires_grad=True)
    module(x).backward()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        for _ in range(120):
            module(x).backward()
        torch.cuda.set_sync_debug_mode("default")
    print(name, "warnings:", [str(w.message)[:160] for w in caught])
    fresh = build().cuda()
    fresh(x).backward()
    torch.cuda.synchronize()
    for call in range(120):
        torch.cuda.set_sync_debug_mode("error")
        try:
            fresh(x).backward()
        except RuntimeError:
            torch.cuda.set_sync_debug_mode("default")
            print(name, "call", call, "synced at:\n", "".join(traceback.format_exc().splitlines(True)[-14:]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    if name in ("STk", "MATk"):
        print(name, "lam", module.threshold, "monitor", vars(module.monitor))
