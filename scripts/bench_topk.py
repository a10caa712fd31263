"""Forward + backward time and peak memory of the aggregate losses on n per-sample losses.

    python scripts/bench_topk.py [--device cpu|cuda] [--max-exp 7] [--out-dir results/bench]

Losses: Average, Maximum, ATk (sort), ATk (torch.topk), MATk and STk from topklab.losses, on a
float32 leaf of n losses (``requires_grad``; the backward fills its ``.grad``); n = 1e3 … 10^max-exp,
k ∈ {5, 0.1n, 0.9n} (Average and Maximum have no k). Each (loss, n, k) runs in its own process so
that its peak memory is its own: on CPU the rise of the peak RSS over the RSS after the input was
made, on CUDA ``max_memory_allocated`` over the input's bytes. Times are medians over repeats after
one warm-up call (CUDA: events). Writes ``topk_<device>.json``, ``.md`` and a log-log ``.png``; the
last line printed is the worst ratio STk/Average over n (for each n, the worst over k).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

BENCHED = ("average", "maximum", "atk:method=sort", "atk:method=topk", "matk", "stk")  # then any other aggregate


def spec_of(entry: str) -> tuple[str, dict]:
    """``atk:method=sort`` -> ("atk", {"method": "sort"}): a loss config name and field overrides."""
    name, _, fields = entry.partition(":")
    return name, dict(field.split("=", 1) for field in fields.split(",") if field)


def benched_losses() -> dict[str, tuple[str, bool]]:
    """Display label -> (spec, whether it takes k) for every aggregate in configs/loss/, the
    BENCHED ones first ("ATk (sort)" for atk:method=sort)."""
    from topklab.losses import aggregate_class, aggregate_names

    named = {e.split(":")[0] for e in BENCHED}
    labels = {}
    for entry in (*BENCHED, *(name for name in aggregate_names() if name not in named)):
        name, fields = spec_of(entry)
        cls = aggregate_class(name)
        suffix = f" ({', '.join(fields.values())})" if fields else ""
        labels[cls.__name__ + suffix] = (entry, "k" in cls.hyperparameters)
    return labels


LOSSES = benched_losses()
USES_K = {label for label, (_, uses_k) in LOSSES.items() if uses_k}


def make_loss(label: str, k: int):
    from topklab.losses import build_aggregate

    name, fields = spec_of(LOSSES[label][0])
    return build_aggregate(name, **({"k": k} if label in USES_K else {}), **fields)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(name: str, n: int, k: int, device: str, min_time: float, threads: int) -> dict:
    """Time and measure one (loss, n, k) in this process; returns a JSON-ready dict."""
    import resource

    import torch

    if threads:
        torch.set_num_threads(threads)
    loss = make_loss(name, k).to(device)
    cuda = device.startswith("cuda")

    def step(values):
        values.grad = None
        for p in loss.parameters():
            p.grad = None
        loss(values).backward()

    # start autograd's engine and the thread pools on a tiny input, so that they are not counted
    step(torch.rand(max(k, 16)).to(device).requires_grad_(True))
    generator = torch.Generator().manual_seed(0)
    losses = torch.rand(n, generator=generator).to(device).requires_grad_(True)
    baseline = current_rss_bytes()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
    step(losses)  # warm-up, and the call whose peak memory is reported
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base_alloc
    else:
        peak = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline)
    times = []
    total = 0.0
    while total < min_time or len(times) < 3:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(losses)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            begin = time.perf_counter()
            step(losses)
            seconds = time.perf_counter() - begin
        times.append(seconds)
        total += seconds
    times.sort()
    return {"loss": name, "n": n, "k": k, "seconds": times[len(times) // 2], "repeats": len(times),
            "peak_bytes": int(peak)}


def k_values(n: int) -> dict[str, int]:
    return {"5": 5, "0.1n": max(1, round(0.1 * n)), "0.9n": max(1, round(0.9 * n))}


def render(results: list[dict], device: str, hardware: str) -> str:
    lines = [f"# Aggregate losses: forward + backward on n float32 losses ({device}; {hardware})", "",
             "Median seconds (peak extra memory). Produced by `python scripts/bench_topk.py "
             f"--device {device}`.", ""]
    ns = sorted({r["n"] for r in results})
    header = "| loss | k | " + " | ".join(f"n=1e{len(str(n)) - 1}" for n in ns) + " |"
    lines += [header, "|" + "---|" * (len(ns) + 2)]
    for name in LOSSES:
        for label in (k_values(10)) if name in USES_K else ["-"]:
            cells = []
            for n in ns:
                match = [r for r in results if r["loss"] == name and r["n"] == n and r["k_label"] == label]
                cells.append(f"{match[0]['seconds'] * 1e3:.3g} ms ({match[0]['peak_bytes'] / 2**20:.3g} MiB)"
                             if match else "–")
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "STk / Average time ratio (worst over k) and STk vs ATk (sort):", "",
              "| n | STk/Average | ATk(sort)/STk |", "|---|---|---|"]
    for n in ns:
        lines.append(f"| {n:.0e} | {stk_ratio(results, n):.2f} | {sort_over_stk(results, n):.2f} |")
    return "\n".join(lines) + "\n"


def seconds_of(results, name, n, label=None):
    return [r["seconds"] for r in results if r["loss"] == name and r["n"] == n and (label is None or r["k_label"] == label)]


def stk_ratio(results, n) -> float:
    return max(seconds_of(results, "STk", n)) / seconds_of(results, "Average", n)[0]


def sort_over_stk(results, n) -> float:
    return min(s / t for s, t in zip(seconds_of(results, "ATk (sort)", n), seconds_of(results, "STk", n)))


def plot(results: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in LOSSES:
        label = "0.1n" if name in USES_K else "-"
        rows = sorted((r for r in results if r["loss"] == name and r["k_label"] == label), key=lambda r: r["n"])
        text = name + (" (k=0.1n)" if name in USES_K else "")
        axes[0].loglog([r["n"] for r in rows], [r["seconds"] for r in rows], marker="o", label=text)
        axes[1].loglog([r["n"] for r in rows], [max(r["peak_bytes"], 1) / 2**20 for r in rows], marker="o", label=text)
    axes[0].set(xlabel="n", ylabel="forward + backward (s)", title=f"time ({device})")
    axes[1].set(xlabel="n", ylabel="peak extra memory (MiB)", title=f"memory ({device})")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-exp", type=int, default=3)
    parser.add_argument("--max-exp", type=int, default=7, help="largest n = 10^max-exp (8 on a GPU)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per point")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--worker", nargs=3, metavar=("LOSS", "N", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, n, k = args.worker
        print(json.dumps(worker(name, int(n), int(k), args.device, args.min_time, args.threads)))
        return
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is available here; use --device cpu", file=sys.stderr)
            raise SystemExit(2)
    if not 1 <= args.min_exp <= args.max_exp <= 9:
        print(f"error: need 1 <= --min-exp <= --max-exp <= 9, got {args.min_exp}, {args.max_exp}", file=sys.stderr)
        raise SystemExit(2)
    from topklab.report import make_result, write_result
    from topklab.utils.io import atomic_write_text
    from topklab.utils.provenance import collect, hardware

    results = []
    for exponent in range(args.min_exp, args.max_exp + 1):
        n = 10 ** exponent
        for name in LOSSES:
            for label, k in (k_values(n).items() if name in USES_K else [("-", 1)]):
                out = subprocess.run([sys.executable, __file__, "--worker", name, str(n), str(k),
                                      "--device", args.device, "--min-time", str(args.min_time),
                                      "--threads", str(args.threads)], capture_output=True, text=True)
                if out.returncode != 0:
                    last = (out.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"error: {name} at n={n}, k={k} failed: {last}", file=sys.stderr)
                    raise SystemExit(1)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["k_label"] = label
                results.append(row)
                print(f"{name:>11} n={n:.0e} k={label:>4}: {row['seconds'] * 1e3:9.3f} ms  "
                      f"peak {row['peak_bytes'] / 2**20:8.2f} MiB", flush=True)
    out_dir = Path(args.out_dir)
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    machine = hardware()
    label = ", ".join(machine["gpus"]) if device == "cuda" else (machine.get("processor") or machine["machine"])
    settings = {"device": args.device, "min_exp": args.min_exp, "max_exp": args.max_exp, "min_time": args.min_time,
                "threads": args.threads}
    write_result(out_dir / f"topk_{device}.json", make_result(
        "bench", f"topk_{device}", {"results": results}, command=" ".join(["python", *sys.argv]), config=settings,
        provenance=collect(ROOT)))
    atomic_write_text(out_dir / f"topk_{device}.md", render(results, device, f"{label}, {machine['cpu_count']} cores, {args.threads or machine['torch_threads']} torch threads"))
    plot(results, out_dir / f"topk_{device}.png", device)
    ns = sorted({r["n"] for r in results})
    print(f"wrote {out_dir}/topk_{device}.{{json,md,png}}")
    print(f"worst STk/Average ratio over n: {max(stk_ratio(results, n) for n in ns):.2f}")


if __name__ == "__main__":
    main()
