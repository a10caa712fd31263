"""The tracked call of STk and MATk through its one Triton launch against ``x.mean()`` and ATk (topk) on
a CUDA device: forward + backward per call, CUDA events, the median of interleaved rounds.

    python -m benchmarks tracked_cuda [--sizes 1e3 1e4 …] [--dtype float32 bfloat16] [--rules track solve] [--out DIR]

Needs a CUDA device. Writes ``tracked_cuda.{json,md}`` to ``--out`` (default ``results/bench``): per dtype, k and n the time of
each and its ratio to ``x.mean()``'s. STk and MATk run under each of ``--rules`` (default ``track``; their
first call, which starts λ, is a warm-up call) with ``kernel="triton"``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.harness import bench_device
from benchmarks.harness.output import Measured
from topklab.losses import ATk, MATk, STk


def timed(step, x, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        step(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls  # µs


def column_names(rules: list[str]) -> list[str]:
    """The timed calls in table order: ``x.mean()``, ATk, then STk and MATk under each rule.

    Examples
    --------
    >>> column_names(["track"])
    ['x.mean()', 'ATk (topk)', 'STk (track, triton)', 'MATk (track, triton)']
    """
    return ["x.mean()", "ATk (topk)", *(f"{loss} ({rule}, triton)" for rule in rules for loss in ("STk", "MATk"))]


def steps(k: int, rules: list[str]):
    atk = ATk(k=k)

    def backward(value, x):
        x.grad = None
        value.backward()

    functions = {"x.mean()": lambda x: backward(x.mean(), x), "ATk (topk)": lambda x: backward(atk(x), x)}
    for rule in rules:
        for loss in (STk, MATk):
            module = loss(k=k, lam_update=rule, kernel="triton").cuda()
            functions[f"{loss.__name__} ({rule}, triton)"] = lambda x, module=module: backward(module(x), x)
    return functions


def arguments(parser) -> None:
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e4, 1e5, 1e6, 1e7, 1e8])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--ks", nargs="+", default=["5", "0.1", "0.9"], help="counts or fractions of n")
    parser.add_argument("--rules", nargs="+", default=["track"], help="λ rules (track, solve, adaptive)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="results/bench")


def measure(args) -> Measured:
    bench_device("cuda")
    rows = []
    for dtype in args.dtype:
        for n in (int(size) for size in args.sizes):
            x = torch.rand(n, device="cuda", dtype=getattr(torch, dtype)).mul(3).requires_grad_()
            calls = max(3, min(200, int(2e9 / n / 50)))
            for k_text in args.ks:
                k = int(k_text) if "." not in k_text else max(1, round(float(k_text) * n))
                functions = steps(k, args.rules)
                for function in functions.values():  # warm-up: kernels load, λ starts
                    function(x)
                    function(x)
                times = {name: [] for name in functions}
                for _ in range(args.rounds):
                    for name, function in functions.items():
                        times[name].append(timed(function, x, calls))
                median = {name: statistics.median(values) for name, values in times.items()}
                row = {"dtype": dtype, "n": n, "k": k_text, "us": median}
                row["ratio"] = {name: median[name] / median["x.mean()"] for name in median}
                rows.append(row)
                print(
                    dtype,
                    n,
                    k_text,
                    " ".join(f"{name} {value:.2f}" for name, value in row["ratio"].items()),
                    flush=True,
                )
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    config = {"sizes": args.sizes, "dtype": args.dtype, "ks": args.ks, "rules": args.rules, "rounds": args.rounds}
    return Measured("tracked_cuda", {"meta": meta, "rows": rows}, config, Path(args.out))


def render(result: dict) -> str:
    """The ratio table of a stored result."""
    meta, rows = result["result"]["meta"], result["result"]["rows"]
    rules = result["config"].get("rules", ["track"])  # a result from before --rules timed the tracked rule only
    names = [name for name in column_names(rules) if rows and name in rows[0]["ratio"]]
    lines = [
        f"# The tracked STk/MATk call (one Triton launch) against x.mean() on {meta['device']}",
        "",
        f"Forward + backward per call, CUDA events, median of {result['config']['rounds']} interleaved rounds; torch "
        f"{meta['torch']}. Produced by `{result['command']}`. Ratio to `x.mean()` (µs of `x.mean()` in the last column).",
        "",
        "| dtype | n | k | " + " | ".join(names) + " | x.mean() µs |",
        "|---|---|---|" + "---|" * (len(names) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row['ratio'][name]:.2f}" for name in names)
        lines.append(f"| {row['dtype']} | {row['n']:.0e} | {row['k']} | {cells} | {row['us']['x.mean()']:.1f} |")
    return "\n".join(lines) + "\n"
