"""Where a forward + backward of each aggregate spends its time on CUDA (torch.profiler), at one n:
the ops by CUDA time, the number of aten ops dispatched, and the host-device synchronisations.
    python experiments/device_runs/h200_2026-11-26/profile_losses.py [n]"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from topklab.engine.aggregates import build_aggregate

n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 10**7
rows = {
    "Average": ("average", {}),
    "STk (compiled)": ("stk", {"k": n // 10, "kernel": "compiled"}),
    "STk (eager)": ("stk", {"k": n // 10, "kernel": "eager"}),
    "MATk (compiled)": ("matk", {"k": n // 10, "kernel": "compiled"}),
}
losses = torch.rand(n, generator=torch.Generator().manual_seed(0)).cuda().requires_grad_(True)
for label, (name, fields) in rows.items():
    loss = build_aggregate(name, **fields).cuda()

    def step(loss=loss):
        losses.grad = None
        loss(losses).backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    aten = sum(e.count for e in events if e.key.startswith("aten::")) / 5
    syncs = {
        e.key: e.count / 5
        for e in events
        if e.key
        in (
            "aten::item",
            "aten::_local_scalar_dense",
            "cudaMemcpyAsync",
            "cudaStreamSynchronize",
            "cudaDeviceSynchronize",
        )
    }
    print(f"== {label}, n={n:.0e}: {aten:.0f} aten ops per step; per step: {syncs}")
    print(events.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
