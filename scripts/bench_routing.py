"""Wall time of a training step of the routing rows' language model, dense against routed, side by side.

    python scripts/bench_routing.py [--capacities 0.125 0.25 0.5] [--repeats 10] [--device cpu|cuda]
                                    [--out results/bench/routing_cpu.json]

The model of ``experiment=routing/*`` (4 layers, d 256, FFN 1024, 5,000 pieces, layers 1 and 3
routed) takes forward + backward + AdamW steps on two batch shapes of 2,048 tokens: Multi30k-like
(128 sentences × 16 tokens) and long (16 × 128). Per capacity c, the top-k router and the STk
threshold router (λ set to the (1 − c)-quantile of its scores, so that the same fraction passes; a
threshold-p router at that fraction costs the same) are timed in turn with the dense model
(interleaved, warm-up excluded, median of ``--repeats``); the ratio to dense is measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
SHAPES = {"multi30k-like (128 x 16)": (128, 16), "long (16 x 128)": (16, 128)}


def make_model(router, device):
    import torch

    from topklab.models import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(vocab_size=5000, d_model=256, ffn_dim=1024, heads=4, layers=4, dropout=0.1, router=router)
    return model.to(device), torch.optim.AdamW(model.parameters(), lr=0.0)  # full AdamW work, weights fixed: λ stays calibrated


def step_seconds(model, optimizer, batch, target, device) -> float:
    import torch.nn.functional as F

    from topklab.bench.harness import timed

    def step():
        logits = model(batch)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)) + model.auxiliary_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return timed(step, device)[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", type=float, nargs="+", default=[0.125, 0.25, 0.5])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="default: results/bench/routing_<device>.json")
    args = parser.parse_args(argv)
    import torch

    from topklab.bench.harness import bench_device, write_bench
    from topklab.data.translation import PairBatch
    from topklab.models import STkThresholdRouter, TopKRouter
    from topklab.utils.errors import TopklabError

    try:
        device = bench_device(args.device)
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = []
    for shape, (sentences, length) in SHAPES.items():
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(4, 5000, (sentences, length + 1), generator=generator).to(device)
        batch, target = PairBatch(tokens[:, :0], tokens[:, :-1]), tokens[:, 1:]
        variants = {"dense": make_model(None, device)}
        for c in args.capacities:
            variants[f"top-k, c = {c}"] = make_model(partial(TopKRouter, capacity=c), device)
            model, optimizer = make_model(partial(STkThresholdRouter, capacity=c), device)
            for router in model.routers.values():  # in order: λ at the (1 − c)-quantile of its scores on this batch
                seen = []
                hook = router.score.register_forward_hook(lambda module, inputs, output: seen.append(output.detach()))
                with torch.no_grad():
                    model(batch)
                hook.remove()
                router.lam.data.fill_(float(seen[0].float().flatten().quantile(1 - c)))
            variants[f"STk threshold, c = {c}"] = (model, optimizer)
        times = {name: [] for name in variants}
        routed = {}
        for repeat in range(args.repeats + 2):
            for name, (model, optimizer) in variants.items():
                seconds = step_seconds(model, optimizer, batch, target, device)
                if repeat >= 2:
                    times[name].append(seconds)
                routed[name] = float(model.last_routed.sum()) / (tokens[:, :-1].numel() * max(model.last_routed.shape[1], 1)) \
                    if model.last_routed.shape[1] else 1.0
        dense = statistics.median(times["dense"])
        for name in variants:
            seconds = statistics.median(times[name])
            rows.append({"shape": shape, "variant": name, "step_seconds": seconds, "vs_dense": seconds / dense,
                         "routed_fraction": routed[name]})
            print(f"{shape:<26} {name:<26} {seconds * 1e3:8.1f} ms  {seconds / dense:.2f}x dense  routed {routed[name]:.3f}",
                  flush=True)
    out = write_bench(ROOT, "routing", device, rows, {"capacities": args.capacities, "repeats": args.repeats}, args.out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
