"""Forward + backward time and peak memory of the aggregate losses on n per-sample losses.

    python -m benchmarks topk [--quick] [--device cpu|cuda] [--max-exp 7] [--out-dir results/bench]

Losses: Average, Maximum, ATk (sort), ATk (torch.topk), and MATk and STk through the three paths
of their fused kernel (eager, ``torch.compile``-d, native C++; see topklab.losses.aggregate.kernels), on a
float32 leaf of n losses (``requires_grad``; the backward fills its ``.grad``); n = 1e3 …
10^max-exp, k ∈ {5, 0.1n, 0.9n} (Average and Maximum have no k). Each (loss, n, k) runs in its own
process so that its peak memory is its own: on CPU the process's peak RSS (reset after the warm-up
call, which compiles) over its RSS after the input was made, on CUDA ``max_memory_allocated`` over
the input's bytes. Times are medians over repeats after warm-up calls (CUDA: events), so
compilation is not timed. ``--quick`` runs n ∈ {1e5, 1e6} for Average, ATk (topk) and STk, one
process per loss and no memory column, in about a minute. Writes ``topk_<device>[_quick].json``,
``.md`` and (full runs) a log-log ``.png``.

Then (after a CPU sweep, or alone with ``--against-torch`` on any device) every aggregate as the library
gives it by default against the plain torch expression, side by side
(:mod:`benchmarks.against_torch`; n = 16 … 1e7), written to ``topk_against_torch_<cpu|cuda>.{json,md}``;
the last line printed is its worst ratio against its target.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from benchmarks import against_torch
from benchmarks.harness import bench_device
from benchmarks.harness.isolation import WorkerFailed, project_root, run_isolated
from benchmarks.harness.memory import (
    cuda_peak_bytes,
    current_rss_bytes,
    peak_rss_bytes,
    reset_cuda_peak,
    reset_peak_rss,
)
from benchmarks.harness.output import Measured, device_tag
from benchmarks.harness.timing import Timer, repeat_until, upper_median
from topklab.utils.errors import TopklabError

ROOT = project_root()

BENCHED = (
    "average",
    "maximum",
    "atk:method=sort",
    "atk:method=topk",
    "matk:kernel=eager",
    "matk:kernel=compiled",
    "matk:kernel=native",
    "stk:kernel=eager",
    "stk:kernel=compiled",
    "stk:kernel=native",
)  # then the others
QUICK = ("average", "atk:method=topk", "stk:kernel=eager", "stk:kernel=compiled", "stk:kernel=native")
HEADLINE_MIN_N = 10**5


def headline_loss(device: str) -> str:
    """The STk row of the path that ``kernel=auto`` takes for long rows on ``device``."""
    return "STk (native)" if device == "cpu" else "STk (compiled)"


def spec_of(entry: str) -> tuple[str, dict]:
    """``atk:method=sort`` -> ("atk", {"method": "sort"}): a loss config name and field overrides."""
    name, _, fields = entry.partition(":")
    return name, dict(field.split("=", 1) for field in fields.split(",") if field)


def benched_losses() -> dict[str, tuple[str, bool]]:
    """Display label -> (spec, whether it takes k) for every aggregate in configs/loss/, the
    BENCHED ones first ("ATk (sort)" for atk:method=sort)."""
    from topklab.engine.aggregates import aggregate_class, aggregate_names

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
QUICK_LOSSES = [label for label, (entry, _) in LOSSES.items() if entry in QUICK]


def make_loss(label: str, k: int):
    from topklab.engine.aggregates import build_aggregate

    name, fields = spec_of(LOSSES[label][0])
    return build_aggregate(name, **({"k": k} if label in USES_K else {}), **fields)


def worker(
    name: str, points: list[tuple[int, int]], device: str, min_time: float, threads: int, measure_memory: bool = True
) -> list[dict]:
    """Time (and measure) ``name`` at each (n, k) of ``points`` in this process; JSON-ready rows."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    timer = Timer(device)
    rows = []
    for n, k in points:
        loss = make_loss(name, k).to(device)

        def step(values, loss=loss):
            values.grad = None
            for p in loss.parameters():
                p.grad = None
            loss(values).backward()

        generator = torch.Generator().manual_seed(0)
        # warm up (and compile) on a smaller input of the same kind: autograd's engine, thread pools, kernels
        step(torch.rand(max(k, n // 10), generator=generator).to(device).requires_grad_(True))
        losses = torch.rand(n, generator=generator).to(device).requires_grad_(True)
        if cuda:
            torch.cuda.synchronize()
            reset_cuda_peak()
            base_alloc = torch.cuda.memory_allocated()
        elif measure_memory:
            baseline = current_rss_bytes()
            reset_peak_rss()
        step(losses)  # the first call at this size: the one whose peak memory is reported
        if cuda:
            torch.cuda.synchronize()
            peak = cuda_peak_bytes() - base_alloc
        else:
            peak = max(0, peak_rss_bytes() - baseline) if measure_memory else None
        times = repeat_until(partial(step, losses), min_time, timer, min_repeats=3)
        rows.append(
            {
                "loss": name,
                "n": n,
                "k": k,
                "seconds": upper_median(times),
                "repeats": len(times),
                "peak_bytes": None if peak is None else int(peak),
            }
        )
    return rows


def k_values(n: int) -> dict[str, int]:
    return {"5": 5, "0.1n": max(1, round(0.1 * n)), "0.9n": max(1, round(0.9 * n))}


def seconds_of(results, name, n, label=None) -> list[float]:
    return [
        r["seconds"] for r in results if r["loss"] == name and r["n"] == n and (label is None or r["k_label"] == label)
    ]


def ratio_over(results, name, n) -> float:
    """The worst (largest) time of ``name`` over k at n, divided by Average's time at n."""
    return max(seconds_of(results, name, n)) / seconds_of(results, "Average", n)[0]


def headline(results, fast: str) -> float:
    """Worst ``fast``-STk/Average ratio over n >= 1e5 and every k."""
    return max(ratio_over(results, fast, n) for n in sorted({r["n"] for r in results}) if n >= HEADLINE_MIN_N)


def cell(match: list[dict]) -> str:
    if not match:
        return "–"
    memory = "" if match[0]["peak_bytes"] is None else f" ({match[0]['peak_bytes'] / 2**20:.3g} MiB)"
    return f"{match[0]['seconds'] * 1e3:.3g} ms{memory}"


def winners(results, ns, fast: str) -> list[str]:
    """Plain sentences: where ATk via torch.topk is faster than STk through ``fast``, and where not."""
    wins = {"ATk (topk)": [], fast: []}
    for n in ns:
        for label in k_values(10):
            topk, stk = seconds_of(results, "ATk (topk)", n, label), seconds_of(results, fast, n, label)
            if topk and stk:
                wins["ATk (topk)" if topk[0] < stk[0] else fast].append(f"(n=1e{len(str(n)) - 1}, k={label})")
    return [
        f"- {name} is faster at: {'; '.join(points) if points else 'none of the points'}."
        for name, points in wins.items()
    ]


def render(result: dict) -> str:
    """The table of a stored result: the against-torch table or the sweep over n and k."""
    if result["experiment"].startswith("topk_against_torch"):
        return against_torch.render(result)
    return render_sweep(result)


def render_sweep(result: dict) -> str:
    results, config = result["result"]["results"], result["config"]
    device, machine = device_tag(config["device"]), result["provenance"]["hardware"]
    label = ", ".join(machine["gpus"]) if device == "cuda" else (machine.get("processor") or machine["machine"])
    hardware = f"{label}, {machine['cpu_count']} cores, {config['threads'] or machine['torch_threads']} torch threads"
    command = result["command"]
    fast = headline_loss(device)
    lines = [
        f"# Aggregate losses: forward + backward on n float32 losses ({device}; {hardware})",
        "",
        f"Median time (peak extra memory). Produced by `{command}`.",
        "",
    ]
    ns = sorted({r["n"] for r in results})
    names = [name for name in LOSSES if any(r["loss"] == name for r in results)]
    header = "| loss | k | " + " | ".join(f"n=1e{len(str(n)) - 1}" for n in ns) + " |"
    lines += [header, "|" + "---|" * (len(ns) + 2)]
    for name in names:
        for label in (k_values(10)) if name in USES_K else ["-"]:
            cells = [
                cell([r for r in results if r["loss"] == name and r["n"] == n and r["k_label"] == label]) for n in ns
            ]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    stk_rows = [name for name in names if name.startswith("STk")]
    lines += [
        "",
        "Time ratios (STk: the worst over k; ATk (topk)/STk per k, > 1 where STk is faster):",
        "",
        "| n | " + " | ".join(f"{name}/Average" for name in stk_rows) + f" | ATk (topk)/{fast} at k = 5, 0.1n, 0.9n |",
        "|---|" + "---|" * (len(stk_rows) + 1),
    ]
    for n in ns:
        versus = [f"{t / s:.2f}" for t, s in zip(seconds_of(results, "ATk (topk)", n), seconds_of(results, fast, n))]
        lines.append(
            f"| {n:.0e} | "
            + " | ".join(f"{ratio_over(results, name, n):.2f}" for name in stk_rows)
            + f" | {', '.join(versus) or '–'} |"
        )
    lines += ["", *winners(results, ns, fast)]
    if any(n >= HEADLINE_MIN_N for n in ns) and fast in names:
        lines += [
            "",
            f"worst STk/Average ratio (n >= 1e5): {headline(results, fast):.2f} ({fast}, the path of "
            f"kernel=auto here; every k)",
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Time and peak memory against n of a stored sweep (none for the quick sweep or the against-torch table)."""
    if result["experiment"].startswith("topk_against_torch") or result["config"].get("quick"):
        return False
    results, device = result["result"]["results"], device_tag(result["config"]["device"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in LOSSES:
        label = "0.1n" if name in USES_K else "-"
        rows = sorted((r for r in results if r["loss"] == name and r["k_label"] == label), key=lambda r: r["n"])
        if not rows:
            continue
        text = name + (" (k=0.1n)" if name in USES_K else "")
        axes[0].loglog([r["n"] for r in rows], [r["seconds"] for r in rows], marker="o", label=text)
        axes[1].loglog([r["n"] for r in rows], [max(r["peak_bytes"], 1) / 2**20 for r in rows], marker="o", label=text)
    axes[0].set(xlabel="n", ylabel="forward + backward (s)", title=f"time ({device})")
    axes[1].set(xlabel="n", ylabel="peak extra memory (MiB)", title=f"memory ({device})")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_worker(name: str, points: list[tuple[int, int]], args, measure_memory: bool) -> list[dict]:
    """:func:`worker` in a fresh process (its peak memory its own); a failure ends the benchmark in one line."""
    try:
        return run_isolated(
            "benchmarks.topk:worker", name, points, args.device, args.min_time, args.threads, measure_memory
        )
    except WorkerFailed as err:
        print(f"error: {name} at {points} failed: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def arguments(parser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="n = 1e5, 1e6; Average, ATk (topk), STk; no memory")
    parser.add_argument("--min-exp", type=int, default=3)
    parser.add_argument("--max-exp", type=int, default=7, help="largest n = 10^max-exp (8 on a GPU)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per point")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--losses", nargs="+", choices=list(LOSSES), help="a subset of the rows (default: all)")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--against-torch", action="store_true", help="only the library-against-plain-torch table")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(against_torch.SIZES), help="n of the against-torch table"
    )
    parser.add_argument("--k", type=float, default=0.1, help="k as a fraction of n in the against-torch table")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16", "float64"),
        help="the losses' dtype in the against-torch table (another than float32 is named in the file name)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="the against-torch table also times Average, STk and MATk under torch.compile",
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the against-torch table")
    parser.add_argument(
        "--against-time",
        type=float,
        default=4.0,
        help="seconds of all rounds together, per n, in the against-torch table",
    )


def measure(args) -> Iterator[Measured]:
    """The sweep, then the against-torch table, each handed to the harness (and so written) as it is done."""
    bench_device(args.device)
    if args.quick:
        args.min_exp, args.max_exp = 5, 6
    if not 1 <= args.min_exp <= args.max_exp <= 9:
        raise TopklabError(f"need 1 <= --min-exp <= --max-exp <= 9, got {args.min_exp}, {args.max_exp}")
    if args.compiled and args.device.startswith("cuda") and not args.against_torch:
        raise TopklabError("--compiled times the against-torch table, which runs on a GPU only with --against-torch")
    against = args.against_torch or not args.device.startswith("cuda")
    if against and (
        any(n < 1 for n in args.sizes) or not 0 < args.k <= 1 or args.rounds < 1 or not args.against_time > 0
    ):
        raise TopklabError("need --sizes >= 1, 0 < --k <= 1, --rounds >= 1 and --against-time > 0")
    return _tables(args, against)


def _tables(args, against: bool) -> Iterator[Measured]:
    if not args.against_torch:
        yield sweep(args)
    if against:
        yield compare_with_torch(args)


def compare_with_torch(args) -> Measured:
    """The against-torch table (one process per n on a CPU, one in all on a GPU); its headline is the last line printed."""
    on_gpu = args.device.startswith("cuda")
    # on a CPU each n in its own process (its own heap); on a GPU all in one, so that inductor compiles once
    groups = [args.sizes] if on_gpu else [[n] for n in args.sizes]
    rows = []
    for sizes in groups:
        try:
            found = run_isolated(
                "benchmarks.against_torch:workers",
                sizes,
                args.k,
                args.rounds,
                args.against_time,
                args.threads,
                args.device,
                args.compiled,
                args.dtype,
            )
        except WorkerFailed as err:
            print(
                f"error: the against-torch point(s) n={', '.join(f'{n:,}' for n in sizes)} failed: {err}",
                file=sys.stderr,
            )
            raise SystemExit(1) from None
        for row in found:
            mine = ", ".join(f"{r['loss']} {r['ratio']:.2f}" for r in against_torch.ratios([row]))
            print(f"against torch n={row['n']:,}: {mine}", flush=True)
        rows += found
    settings = {
        "sizes": args.sizes,
        "k": args.k,
        "rounds": args.rounds,
        "against_time": args.against_time,
        "threads": args.threads,
        "device": args.device,
        "compiled": args.compiled,
        "dtype": args.dtype,
    }
    suffix = "" if args.dtype == "float32" else f"_{args.dtype}"
    return Measured(
        f"topk_against_torch_{'cuda' if on_gpu else 'cpu'}{suffix}",
        {"rows": rows},
        settings,
        Path(args.out_dir),
        summary=against_torch.headline(rows),
    )


def sweep(args) -> Measured:
    """The per-loss sweep over n = 10^min-exp … 10^max-exp and k (time and peak memory)."""
    ns = [10**exponent for exponent in range(args.min_exp, args.max_exp + 1)]
    results = []
    for name in QUICK_LOSSES if args.quick else args.losses or LOSSES:
        points = [(n, label, k) for n in ns for label, k in (k_values(n).items() if name in USES_K else [("-", 1)])]
        # one process per point measures a CPU point's own peak RSS; CUDA measures in-process (and compiles once)
        batches = [points] if args.quick or args.device.startswith("cuda") else [[point] for point in points]
        for batch in batches:
            rows = run_worker(name, [(n, k) for n, _, k in batch], args, measure_memory=not args.quick)
            for (n, label, _), row in zip(batch, rows):
                row["k_label"] = label
                results.append(row)
                memory = "" if row["peak_bytes"] is None else f"  peak {row['peak_bytes'] / 2**20:8.2f} MiB"
                print(f"{name:>15} n={n:.0e} k={label:>4}: {row['seconds'] * 1e3:9.3f} ms{memory}", flush=True)
    device = device_tag(args.device)
    settings = {
        "device": args.device,
        "quick": args.quick,
        "min_exp": args.min_exp,
        "max_exp": args.max_exp,
        "min_time": args.min_time,
        "threads": args.threads,
        "losses": args.losses,
    }
    fast = headline_loss(device)
    summary = (
        f"worst STk/Average ratio (n >= 1e5): {headline(results, fast):.2f}"
        if fast in {r["loss"] for r in results} and any(n >= HEADLINE_MIN_N for n in ns)
        else ""
    )
    stem = f"topk_{device}" + ("_quick" if args.quick else "")
    return Measured(stem, {"results": results}, settings, Path(args.out_dir), summary=summary)
