"""How long each gradient-sparsification selector takes to pick k of P entries, side by side.

    python -m benchmarks sparsification [--sizes 100000 1000000 10000000 100000000] [--ratios 0.01 0.001]
                                        [--repeats 5] [--device cpu|cuda] [--out results/bench/sparsification_cpu.json]

For each P and keep ratio (k = ⌈ratio·P⌉) on gradient-like magnitudes (|N(0, 1)|·exp(N(0, 1)), a
heavy tail), the selectors of ``configs/gradient_exchange/`` at their defaults are timed in turn
(interleaved, one warm-up call excluded, the median of ``--repeats``): ``torch.topk``, the sampled
threshold (its default adaptation, bracketed to exactly k), and the STk threshold twice: cold (no previous λ) and warm (λ from the same vector before a
1 % multiplicative perturbation, as between training steps), each with its Newton sums as torch
operations (the selector's default, ``kernel=eager``) and in one C++ pass (``kernel=native``), and
``x.abs().sum()``, one read of the
vector: the memory-bandwidth floor. Each row gives the time, its ratio to ``torch.topk`` and to the
floor measured in the same run, ns per element, the passes over the vector (STk), the count sent
relative to k, the recall of the true top-k, and for the sampled threshold the 5th-95th percentile of
sent/k over 20 messages.
Writes a result envelope (JSON) with the command and provenance; ``python -m topklab.report tables``
renders it into results/tables/gradient_sparsification.md.
"""

from __future__ import annotations

import math
import statistics
from functools import partial

from benchmarks.harness.isolation import project_root
from benchmarks.harness.output import Measured, json_file

ROOT = project_root()
SENT_DRAWS = 20  # sampled-threshold messages drawn per size (each on a 1 %-perturbed vector) for the sent/k percentiles
# the STk selector's kernels, as labelled in the rows, and its passes over the magnitudes per Newton step: eager
# torch operations (z, r, z/r + sum, r⁻³ + sum) or one C++ pass
STK_KERNELS = {"eager": "", "native": " (native)"}
STK_PASSES_PER_STEP = {"eager": 6, "native": 1}


def magnitudes(n: int, seed: int, device):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=generator).abs() * torch.randn(n, generator=generator).exp()).to(device)


def measure_point(n: int, ratio: float, repeats: int, device) -> list[dict]:
    import torch

    from benchmarks.harness.compare import interleaved, ratios
    from benchmarks.harness.timing import timed
    from topklab.sparsification import ExactTopK, SampledThreshold, STkThresholdSelector

    k = max(1, math.ceil(ratio * n))
    values = magnitudes(n, 0, device)
    previous = values * (1 + 0.01 * torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device))
    true_top = torch.zeros(n, dtype=torch.bool, device=device)
    true_top[values.topk(k).indices] = True

    def warm_stk(kernel):
        selector = STkThresholdSelector(kernel=kernel)
        selector.threshold(previous, k)
        return selector

    warm = {kernel: warm_stk(kernel) for kernel in STK_KERNELS}
    last_cold = {}

    def cold_stk(kernel):
        last_cold[kernel] = STkThresholdSelector(kernel=kernel)
        return last_cold[kernel](values, k)

    selectors = {
        "exact top-k": lambda: ExactTopK()(values, k),
        "sampled threshold, bracketed to k": lambda: SampledThreshold(seed=0)(values, k),
        **{
            f"STk threshold{label}, {state}": (
                partial(cold_stk, kernel) if state == "cold" else partial(warm[kernel], values, k)
            )  # the warm start is set up outside the timer
            for kernel, label in STK_KERNELS.items()
            for state in ("cold", "warm")
        },
        "bandwidth floor: x.abs().sum()": lambda: values.abs().sum(),
    }
    times, chosen = interleaved(
        selectors,
        repeats,
        partial(timed, device=device),
        warmup=1,
        setup={
            f"STk threshold{label}, warm": partial(
                lambda kernel: warm[kernel].lam.fill_(float(warm_stk(kernel).lam)), kernel
            )
            for kernel, label in STK_KERNELS.items()
        },
    )
    sent = sorted(
        len(
            SampledThreshold(seed=seed)(
                values * (1 + 0.01 * torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(device)), k
            )
        )
        / k
        for seed in range(SENT_DRAWS)
    )
    passes = {
        f"STk threshold{label}, {state}": STK_PASSES_PER_STEP[kernel]
        * (last_cold[kernel] if state == "cold" else warm[kernel]).iterations
        + 2
        for kernel, label in STK_KERNELS.items()
        for state in ("cold", "warm")
    }
    rows = []
    for name in selectors:
        indices = chosen[name]
        row = {"n": n, "ratio": ratio, "k": k, "selector": name, "seconds": statistics.median(times[name])}
        if name.startswith("bandwidth"):
            row.update(count_over_k=None, recall=None)
        else:
            row.update(count_over_k=len(indices) / k, recall=float(true_top[indices].sum()) / k)
        if name in passes:
            row["passes"] = passes[name]
        if name.startswith("sampled"):
            row["sent_over_k_p5_p95"] = [sent[int(0.05 * (SENT_DRAWS - 1))], sent[int(0.95 * (SENT_DRAWS - 1))]]
        rows.append(row)
    seconds = {row["selector"]: row["seconds"] for row in rows}
    vs_topk, vs_floor = ratios(seconds, rows[0]["selector"]), ratios(seconds, rows[-1]["selector"])
    for row in rows:
        row.update(
            vs_topk=vs_topk[row["selector"]],
            vs_floor=vs_floor[row["selector"]],
            ns_per_element=row["seconds"] / n * 1e9,
        )
    return rows


def arguments(parser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", type=json_file, default=None, help="default: results/bench/sparsification_<device>.json"
    )


def measure(args) -> Measured:
    from benchmarks.harness import bench_device, device_rows

    device = bench_device(args.device)
    rows = []
    for n in args.sizes:
        for ratio in args.ratios:
            for row in measure_point(n, ratio, args.repeats, device):
                rows.append(row)
                quality = (
                    "" if row["recall"] is None else f"  sent/k {row['count_over_k']:.3f}  recall {row['recall']:.3f}"
                )
                print(
                    f"P={n:>11,} keep {ratio:.1%}  {row['selector']:<30} {row['seconds'] * 1e3:9.2f} ms "
                    f"({row['vs_topk']:.2f}x topk, {row['vs_floor']:.1f}x floor, {row['ns_per_element']:.2f} ns/element"
                    f"{'' if 'passes' not in row else ', ' + str(row['passes']) + ' passes'}){quality}",
                    flush=True,
                )
    settings = {"sizes": args.sizes, "ratios": args.ratios, "repeats": args.repeats}
    return device_rows(ROOT, "sparsification", device, rows, settings, args.out)
