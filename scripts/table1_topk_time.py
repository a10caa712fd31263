"""STk paper Table 1: time to find the sum of the k = 5 largest of n = 10,000 standard-normal
samples, each algorithm run on the same 50 fresh samples (mean ± std seconds).

    python scripts/table1_topk_time.py [--runs 50] [--n 10000] [--k 5] [--out results/bench/table1.json]

BubbleSort and HeapSort are pure-Python full sorts; ATk and STk iterate on λ (Adam on Eq. 1 / Eq. 3,
vectorised torch, until the top-k sum read out at λ is within 1e-2 of the truth); "sort (torch)" is
torch.sort for reference. See topklab.bench.topk_sum. `make tables` renders results/tables/table1.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from topklab.bench.topk_sum import (bubble_sort_topk_sum, heap_sort_topk_sum, lambda_iteration,  # noqa: E402
                                    sort_topk_sum)
from topklab.report import make_result, write_result  # noqa: E402
from topklab.utils.provenance import collect  # noqa: E402

ALGORITHMS = {
    # name: (language level, callable(values_list, values_tensor, k, target) -> (answer, iterations))
    "BubbleSort": ("pure Python loops", lambda lst, t, k, target, a: (bubble_sort_topk_sum(lst, k), None)),
    "HeapSort": ("pure Python loops", lambda lst, t, k, target, a: (heap_sort_topk_sum(lst, k), None)),
    "ATk": ("torch vectorised, Python loop over λ steps",
            lambda lst, t, k, target, a: lambda_iteration(t, k, target, "atk", lr=a.lr, tol=a.tol)),
    "STk": ("torch vectorised, Python loop over λ steps",
            lambda lst, t, k, target, a: lambda_iteration(t, k, target, "stk", delta=a.delta, lr=a.lr, tol=a.tol)),
    "sort (torch)": ("torch.sort, compiled C++", lambda lst, t, k, target, a: (sort_topk_sum(t, k), None)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1, help="Adam step size of the λ iterations")
    parser.add_argument("--delta", type=float, default=0.01, help="SReLU δ of STk")
    parser.add_argument("--tol", type=float, default=1e-2, help="stop when |answer − true sum| < tol")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--out", default=str(ROOT / "results" / "bench" / "table1.json"))
    args = parser.parse_args()
    names = args.algorithms.split(",")
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or args.runs < 1 or not 1 <= args.k <= args.n:
        print(f"error: need known algorithms ({', '.join(ALGORITHMS)}), runs >= 1 and 1 <= k <= n; "
              f"got algorithms={unknown or names}, runs={args.runs}, k={args.k}, n={args.n}", file=sys.stderr)
        raise SystemExit(2)
    torch.set_num_threads(1)  # one core for every algorithm, like the single-threaded sorts
    generator = torch.Generator().manual_seed(args.seed)
    samples = [torch.randn(args.n, generator=generator, dtype=torch.float64) for _ in range(args.runs)]
    rows = {name: {"level": ALGORITHMS[name][0], "seconds": [], "iterations": [], "abs_error": []} for name in names}
    warm = torch.randn(100, generator=torch.Generator().manual_seed(args.seed + 1), dtype=torch.float64)
    warm_target = float(torch.topk(warm, min(args.k, 100)).values.sum())
    for name in names:  # first calls pay one-off costs (lazy imports, allocator), not timed
        ALGORITHMS[name][1](warm.tolist(), warm, min(args.k, 100), warm_target, args)
    for run, values in enumerate(samples):
        target = float(torch.topk(values, args.k).values.sum())
        as_list = values.tolist()
        for name in names:
            start = time.perf_counter()
            answer, iterations = ALGORITHMS[name][1](as_list, values, args.k, target, args)
            rows[name]["seconds"].append(time.perf_counter() - start)
            rows[name]["abs_error"].append(abs(answer - target))
            if iterations is not None:
                rows[name]["iterations"].append(iterations)
        print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{n} {rows[n]['seconds'][-1]:.4f} s" for n in names),
              flush=True)
    paper = yaml.safe_load((ROOT / "results" / "paper" / "stk_neurips2024.yaml").read_text())["table1"]["rows"]
    for name in names:
        seconds = rows[name]["seconds"]
        rows[name]["mean"] = statistics.fmean(seconds)
        rows[name]["std"] = statistics.pstdev(seconds)
        published = f"paper {paper[name][0]:.4f} ± {paper[name][1]:.4f} s" if name in paper else "paper: not reported"
        print(f"{name:>14}: ours {rows[name]['mean']:.4f} ± {rows[name]['std']:.4f} s, {published} "
              f"({rows[name]['level']})")
    settings = {"n": args.n, "k": args.k, "runs": args.runs, "seed": args.seed, "lr": args.lr, "delta": args.delta,
                "tol": args.tol, "threads": 1}
    result = make_result("bench", "table1", {"algorithms": rows, "order": names}, command=" ".join(["python", *sys.argv]),
                         config=settings, provenance=collect(ROOT))
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
