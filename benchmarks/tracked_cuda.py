"""The tracked call of STk and MATk through its one Triton launch against ``x.mean()`` and ATk (topk) on
a CUDA device: forward + backward per call, CUDA events, the median of interleaved rounds.

    python -m benchmarks tracked_cuda [--sizes 1e3 1e4 …] [--dtype float32 bfloat16] [--rules track solve]
                                      [--graphed] [--out DIR]

Needs a CUDA device. Writes ``tracked_cuda.{json,md}`` to ``--out`` (default ``results/bench``): per dtype, k and n the time of
each and its ratio to ``x.mean()``'s. STk and MATk run under each of ``--rules`` (default ``track``; their
first call, which starts λ, is a warm-up call) with ``kernel="triton"``.

``--graphed`` (``tracked_cuda_graphed.{json,md}``): every candidate's forward + backward, ``x.mean()``'s
included, is captured once in a CUDA graph after its warm-up and timed by replays, so that the host's
Python and Triton's launcher drop out and the kernels' own time is compared (what
``torch.compile(mode="reduce-overhead")`` replays). The λ monitor's sample, a host-side selection every
50th call, is left out of STk and MATk there, as capture requires.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.harness import bench_device
from benchmarks.harness.compare import ratios
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


def steps(k: int, rules: list[str], graphed: bool = False):
    """``{name: forward + backward on x}`` for each candidate (:func:`column_names`); ``graphed``: STk and
    MATk without the monitor's host-side sample, so that a call can be captured."""
    atk = ATk(k=k)

    def backward(value, x):
        x.grad = None
        value.backward()

    functions = {"x.mean()": lambda x: backward(x.mean(), x), "ATk (topk)": lambda x: backward(atk(x), x)}
    for rule in rules:
        for loss in (STk, MATk):
            module = loss(k=k, lam_update=rule, kernel="triton").cuda()
            if graphed:
                module.monitor.sample_every = 10**9
            functions[f"{loss.__name__} ({rule}, triton)"] = lambda x, module=module: backward(module(x), x)
    return functions


class NotCaptured(Exception):
    """A call that CUDA-graph capture refused (a host read in it); the process cannot capture again."""


class Replay:
    """A captured call: replays its graph, and holds the eager call, whose module's buffers are the
    addresses the graph reads and writes."""

    def __init__(self, graph, eager):
        self.graph, self.eager = graph, eager

    def __call__(self, x: torch.Tensor) -> None:
        self.graph.replay()


def captured(name: str, function, x: torch.Tensor) -> Replay:
    """``function`` (a forward + backward on ``x``, already warmed up) captured in a CUDA graph after
    three calls on a side stream, replayed on the same ``x`` (``x.grad`` in the graph's memory). A
    refused capture raises :class:`NotCaptured` with its cause: a failed capture leaves the allocator
    mid-capture, so nothing more is captured in this process."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            function(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    try:
        with torch.cuda.graph(graph):
            function(x)
    except RuntimeError as error:
        cause = error.__context__ or error  # ending a broken capture raises again; the first error says why
        raise NotCaptured(f"{name}: {str(cause).splitlines()[0]}") from None
    return Replay(graph, function)


def arguments(parser) -> None:
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e4, 1e5, 1e6, 1e7, 1e8])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--ks", nargs="+", default=["5", "0.1", "0.9"], help="counts or fractions of n")
    parser.add_argument("--rules", nargs="+", default=["track"], help="λ rules (track, solve, adaptive)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--graphed", action="store_true", help="time each forward + backward replayed from a CUDA graph"
    )
    parser.add_argument("--out", default="results/bench")


def measured_row(dtype: str, n: int, k_text: str, args) -> dict:
    """Each candidate's median µs and its ratio to ``x.mean()``'s at one dtype, n and k."""
    x = torch.rand(n, device="cuda", dtype=getattr(torch, dtype)).mul(3).requires_grad_()
    calls = max(3, min(200, int(2e9 / n / 50)))
    k = int(k_text) if "." not in k_text else max(1, round(float(k_text) * n))
    functions = steps(k, args.rules, args.graphed)
    for function in functions.values():  # warm-up: kernels load, λ starts
        function(x)
        function(x)
    if args.graphed:
        functions = {name: captured(name, function, x) for name, function in functions.items()}
    times = {name: [] for name in functions}
    for _ in range(args.rounds):
        for name, function in functions.items():
            times[name].append(timed(function, x, calls))
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"dtype": dtype, "n": n, "k": k_text, "us": median, "ratio": ratios(median, "x.mean()")}


def measure(args) -> Measured:
    bench_device("cuda")
    rows, stopped = [], None
    cells = [(dtype, int(size), k_text) for dtype in args.dtype for size in args.sizes for k_text in args.ks]
    for dtype, n, k_text in cells:
        try:
            rows.append(measured_row(dtype, n, k_text, args))
        except NotCaptured as refused:  # the rows so far are kept; the table says where it stopped
            stopped = f"{dtype}, n = {n:.0e}, k = {k_text}: {refused}"
            print(f"stopped at {stopped}", flush=True)
            break
        print(
            dtype, n, k_text, " ".join(f"{name} {value:.2f}" for name, value in rows[-1]["ratio"].items()), flush=True
        )
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "stopped": stopped}
    config = {"sizes": args.sizes, "dtype": args.dtype, "ks": args.ks, "rules": args.rules, "rounds": args.rounds}
    config["graphed"] = args.graphed
    stem = "tracked_cuda_graphed" if args.graphed else "tracked_cuda"
    return Measured(stem, {"meta": meta, "rows": rows}, config, Path(args.out))


def render(result: dict) -> str:
    """The ratio table of a stored result."""
    meta, rows = result["result"]["meta"], result["result"]["rows"]
    rules = result["config"].get("rules", ["track"])  # a result from before --rules timed the tracked rule only
    names = [name for name in column_names(rules) if rows and name in rows[0]["ratio"]]
    graphed = result["config"].get("graphed", False)
    how = "each replayed from a CUDA graph (no host Python, no launcher)" if graphed else "eager"
    lines = [
        f"# The STk/MATk training call's Triton launches against x.mean() on {meta['device']}",
        "",
        f"Forward + backward per call, {how}; CUDA events, median of {result['config']['rounds']} interleaved rounds; "
        f"torch {meta['torch']}. Produced by `{result['command']}`. Ratio to `x.mean()` (µs of `x.mean()` in the "
        "last column).",
        "",
        "| dtype | n | k | " + " | ".join(names) + " | x.mean() µs |",
        "|---|---|---|" + "---|" * (len(names) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row['ratio'][name]:.2f}" for name in names)
        lines.append(f"| {row['dtype']} | {row['n']:.0e} | {row['k']} | {cells} | {row['us']['x.mean()']:.1f} |")
    if meta.get("stopped"):
        lines += ["", f"Stopped before the rows asked for were done: a capture was refused at {meta['stopped']}."]
    return "\n".join(lines) + "\n"
