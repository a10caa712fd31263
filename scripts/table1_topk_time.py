"""STk paper Table 1: time to find the sum of the k = 5 largest of n = 10,000 standard-normal
samples, each algorithm run on the same 50 fresh samples (mean ± std seconds).

    python scripts/table1_topk_time.py [--runs 50] [--n 10000] [--k 5] [--out results/bench/table1.json]

The paper's algorithms, as we read them: BubbleSort and HeapSort are pure-Python full sorts; ATk and
STk iterate on λ (Adam on Eq. 1 / Eq. 3, vectorised torch, until the top-k sum read out at λ is within
1e-2 of the truth). Ours, not in the paper, with the same read-out and stopping rule, in torch and in
numpy (arrays made from the same float64 samples outside the timer): STk by safeguarded Newton on
Eq. 3, ATk by bisection on λ and by one selection of the k-th largest. "sort (torch)" is torch.sort,
for reference. Each row records its "origin" (paper / ours / reference) and its λ iterations. See
topklab.synthetic.topk_sum. `make tables` renders results/tables/table1.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from topklab.report import make_result, write_result  # noqa: E402
from topklab.synthetic.topk_sum import (  # noqa: E402
    atk_bisection,
    atk_selection,
    bubble_sort_topk_sum,  # noqa: E402
    heap_sort_topk_sum,
    lambda_iteration,
    sort_topk_sum,
    stk_newton,
)
from topklab.utils.provenance import collect  # noqa: E402


class Sample(NamedTuple):
    """One draw of n values in the three forms the algorithms take (made before any timer starts)."""

    as_list: list[float]
    tensor: torch.Tensor  # float64
    array: np.ndarray  # float64, the same values

    @classmethod
    def of(cls, values: torch.Tensor) -> Sample:
        return cls(values.tolist(), values, values.numpy())


@dataclass(frozen=True)
class Algorithm:
    """One Table 1 row: how it runs, whose algorithm it is, and ``run(sample, k, target, args) -> (top-k sum,
    λ iterations or None)``."""

    level: str
    origin: str  # "paper" (the paper's algorithm as we read it), "ours" (not in the paper) or "reference"
    run: Callable[[Sample, int, float, argparse.Namespace], tuple[float, int | None]]


NEWTON = "Python loop over safeguarded Newton / bisection λ steps"
ALGORITHMS = {
    "BubbleSort": Algorithm(
        "pure Python loops", "paper", lambda s, k, target, a: (bubble_sort_topk_sum(s.as_list, k), None)
    ),
    "HeapSort": Algorithm(
        "pure Python loops", "paper", lambda s, k, target, a: (heap_sort_topk_sum(s.as_list, k), None)
    ),
    "ATk": Algorithm(
        "torch vectorised, Python loop over λ steps",
        "paper",
        lambda s, k, target, a: lambda_iteration(s.tensor, k, target, "atk", lr=a.lr, tol=a.tol),
    ),
    "STk": Algorithm(
        "torch vectorised, Python loop over λ steps",
        "paper",
        lambda s, k, target, a: lambda_iteration(s.tensor, k, target, "stk", delta=a.delta, lr=a.lr, tol=a.tol),
    ),
    "STk Newton (torch)": Algorithm(
        f"torch vectorised, {NEWTON}",
        "ours",
        lambda s, k, target, a: stk_newton(s.tensor, k, target, delta=a.delta, tol=a.tol),
    ),
    "STk Newton (numpy)": Algorithm(
        f"numpy vectorised, {NEWTON}",
        "ours",
        lambda s, k, target, a: stk_newton(s.array, k, target, delta=a.delta, tol=a.tol),
    ),
    "ATk bisection (torch)": Algorithm(
        "torch vectorised, Python loop over bisection λ steps",
        "ours",
        lambda s, k, target, a: atk_bisection(s.tensor, k, target, tol=a.tol),
    ),
    "ATk bisection (numpy)": Algorithm(
        "numpy vectorised, Python loop over bisection λ steps",
        "ours",
        lambda s, k, target, a: atk_bisection(s.array, k, target, tol=a.tol),
    ),
    "ATk selection (torch)": Algorithm(
        "λ = k-th largest by torch.kthvalue (compiled C++), then Eq. 1",
        "ours",
        lambda s, k, target, a: atk_selection(s.tensor, k),
    ),
    "ATk selection (numpy)": Algorithm(
        "λ = k-th largest by np.partition (compiled C), then Eq. 1",
        "ours",
        lambda s, k, target, a: atk_selection(s.array, k),
    ),
    "sort (torch)": Algorithm(
        "torch.sort, compiled C++", "reference", lambda s, k, target, a: (sort_topk_sum(s.tensor, k), None)
    ),
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
        print(
            f"error: need known algorithms ({', '.join(ALGORITHMS)}), runs >= 1 and 1 <= k <= n; "
            f"got algorithms={unknown or names}, runs={args.runs}, k={args.k}, n={args.n}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    torch.set_num_threads(1)  # one core for every algorithm, like the single-threaded sorts
    generator = torch.Generator().manual_seed(args.seed)
    samples = [torch.randn(args.n, generator=generator, dtype=torch.float64) for _ in range(args.runs)]
    rows = {
        name: {
            "level": ALGORITHMS[name].level,
            "origin": ALGORITHMS[name].origin,
            "seconds": [],
            "iterations": [],
            "abs_error": [],
        }
        for name in names
    }
    warm = torch.randn(100, generator=torch.Generator().manual_seed(args.seed + 1), dtype=torch.float64)
    warm_target = float(torch.topk(warm, min(args.k, 100)).values.sum())
    for name in names:  # first calls pay one-off costs (lazy imports, allocator), not timed
        ALGORITHMS[name].run(Sample.of(warm), min(args.k, 100), warm_target, args)
    for run, values in enumerate(samples):
        target = float(torch.topk(values, args.k).values.sum())
        sample = Sample.of(values)
        for name in names:
            start = time.perf_counter()
            answer, iterations = ALGORITHMS[name].run(sample, args.k, target, args)
            rows[name]["seconds"].append(time.perf_counter() - start)
            rows[name]["abs_error"].append(abs(answer - target))
            if iterations is not None:
                rows[name]["iterations"].append(iterations)
        print(
            f"run {run + 1}/{args.runs}: " + ", ".join(f"{n} {rows[n]['seconds'][-1]:.4f} s" for n in names), flush=True
        )
    paper = yaml.safe_load((ROOT / "results" / "paper" / "stk_neurips2024.yaml").read_text())["table1"]["rows"]
    for name in names:
        seconds = rows[name]["seconds"]
        rows[name]["mean"] = statistics.fmean(seconds)
        rows[name]["std"] = statistics.pstdev(seconds)
        published = f"paper {paper[name][0]:.4f} ± {paper[name][1]:.4f} s" if name in paper else "paper: not reported"
        iterations = (
            f", {statistics.fmean(rows[name]['iterations']):.1f} λ iterations (max {max(rows[name]['iterations'])})"
            if rows[name]["iterations"]
            else ""
        )
        print(
            f"{name:>21}: ours {rows[name]['mean']:.4f} ± {rows[name]['std']:.4f} s{iterations}, {published} "
            f"({rows[name]['origin']}: {rows[name]['level']})"
        )
    settings = {
        "n": args.n,
        "k": args.k,
        "runs": args.runs,
        "seed": args.seed,
        "lr": args.lr,
        "delta": args.delta,
        "tol": args.tol,
        "threads": 1,
    }
    result = make_result(
        "bench",
        "table1",
        {"algorithms": rows, "order": names},
        command=" ".join(["python", *sys.argv]),
        config=settings,
        provenance=collect(ROOT),
    )
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
