"""The aggregates as a user gets them (the library's defaults) against the plain torch expression a
user would otherwise write, forward + backward, measured side by side against their speed target.

    python -m benchmarks topk --against-torch [--sizes 16 64 ...] [--k 0.1] [--dtype float32] [--rounds 15]

Pairs (library module in training mode : plain expression), on a float32 leaf of n losses:
``Average()`` : ``x.mean()``, ``Maximum()`` : ``x.max()``, ``ATk(k)`` : ``x.topk(k).values.mean()``,
``STk(k)`` and ``MATk(k)`` (λ tracked, a step per call: the default) : ``x.mean()``. On a CPU (one torch
thread by default) each n runs in its own process; on a GPU (``--device cuda``) all run in one, and each
loop is timed from a synchronize to a synchronize. Every call is warmed up (STk's and MATk's first call
starts λ), then ``rounds`` rounds each time a loop of calls of every library module and every
expression, in turn (after one untimed call), so that load from elsewhere falls on both sides alike;
all rounds of one n take about ``--against-time`` seconds. Within a round each library module's loop
runs next to its plain expression's (every other round the expression first), and a ratio is the median
over rounds of library / plain from the same round: the machine's load changes over seconds, and a
ratio of two loops a few milliseconds apart sees the same load. A call's time (the table of plain times)
is the median over rounds of its loop's time per call. The target: STk and MATk ≤ 1.2,
Average, Maximum and ATk ≤ 1.1, at every n. A control row times a bare ``nn.Module`` whose forward is
``x.mean()``: what being a module costs over the bare expression on the machine (and the harness's
spread), no target.
"""

from __future__ import annotations

import statistics
import time

from topklab.report.outputs import machine_label

TARGETS = {"Average": 1.1, "Maximum": 1.1, "ATk": 1.1, "STk": 1.2, "MATk": 1.2}
PLAIN = {
    "Average": "x.mean()",
    "Maximum": "x.max()",
    "ATk": "x.topk(k).values.mean()",
    "STk": "x.mean()",
    "MATk": "x.mean()",
}
SIZES = (16, 64, 256, 1024, 4096, 16384, 10**5, 10**6, 10**7)
CONTROL = "a bare module returning x.mean()"


COMPILED = ("Average", "STk", "MATk")  # --compiled: these also under torch.compile(fullgraph=True)


def calls(k: int, compiled: bool = False):
    """(label -> library module, expression name -> plain callable, the control among them) for one k;
    with ``compiled`` also ``"<label> compiled"``, the module under ``torch.compile(fullgraph=True)``
    (what a user who compiles the step gets)."""
    import torch

    from topklab.losses import ATk, MATk, STk
    from topklab.losses.aggregate import Average, Maximum

    without_k, with_k = {"Average": Average, "Maximum": Maximum}, {"ATk": ATk, "STk": STk, "MATk": MATk}

    def build(label: str):  # a fresh module each time: a compiled one keeps its own λ
        return without_k[label]() if label in without_k else with_k[label](k=k)

    library = {label: build(label) for label in TARGETS}
    if compiled:
        library |= {f"{label} compiled": torch.compile(build(label), fullgraph=True) for label in COMPILED}

    class MeanModule(torch.nn.Module):
        def forward(self, x):
            return x.mean()

    plain = {
        "x.mean()": lambda x: x.mean(),
        "x.max()": lambda x: x.max(),
        "x.topk(k).values.mean()": lambda x: x.topk(k).values.mean(),
        CONTROL: MeanModule(),
    }
    return library, plain


def base_label(label: str) -> str:
    return label.removesuffix(" compiled")


def worker(
    n: int,
    k_fraction: float,
    rounds: int,
    min_time: float,
    threads: int,
    device: str = "cpu",
    compiled: bool = False,
    dtype: str = "float32",
) -> dict:
    """Per-call seconds (median over rounds) of every library module and plain expression at n, on
    ``device`` (on a GPU each loop's time runs from a synchronize to a synchronize), and per library module
    (and the control) the median over rounds of its time over its plain expression's, timed one after
    the other in the same round."""
    import torch

    from topklab.utils.k import resolve_k

    if threads:
        torch.set_num_threads(threads)
    k = resolve_k(k_fraction, n)
    if compiled:
        torch._dynamo.reset()  # k is a constant of the compiled graphs: each n compiles afresh, not into the limit
    library, plain = calls(k, compiled)
    library = {label: module.to(device) for label, module in library.items()}
    x = torch.rand(n, generator=torch.Generator().manual_seed(0)).to(device, getattr(torch, dtype)).requires_grad_()
    synchronize = (lambda: torch.cuda.synchronize(x.device)) if x.is_cuda else (lambda: None)
    steps = {**library, **plain}
    pairs = [(label, PLAIN[base_label(label)]) for label in library] + [(CONTROL, "x.mean()")]

    def step(function):
        x.grad = None
        function(x).backward()

    def timed(name: str, loops: int) -> float:
        step(steps[name])  # untimed: the first call after another function's finds the caches holding its data
        synchronize()
        began = time.perf_counter()
        for _ in range(loops):
            step(steps[name])
        synchronize()
        return (time.perf_counter() - began) / loops

    for function in steps.values():  # warm-up: the first STk/MATk call starts λ; kernels load
        for _ in range(3):
            step(function)
    per_round = max(sum(timed(a, 1) + timed(b, 1) for a, b in pairs), 1e-9)
    loops = max(1, int(min_time / rounds / per_round))  # calls per loop, so that all rounds take about min_time
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    paired: dict[str, list[float]] = {label: [] for label, _ in pairs}
    for round_ in range(rounds):
        for label, expression in pairs:
            times = {}
            for name in (label, expression) if round_ % 2 == 0 else (expression, label):
                times[name] = timed(name, loops)
                seconds[name].append(times[name])
            paired[label].append(times[label] / times[expression])
    return {
        "n": n,
        "k": k,
        "loops": loops,
        "seconds": {name: statistics.median(values) for name, values in seconds.items()},
        "ratios": {label: statistics.median(values) for label, values in paired.items()},
    }


def workers(
    sizes: list[int],
    k_fraction: float,
    rounds: int,
    min_time: float,
    threads: int,
    device: str,
    compiled: bool,
    dtype: str = "float32",
) -> list[dict]:
    """:func:`worker` at each n, one after another in this process."""
    return [worker(n, k_fraction, rounds, min_time, threads, device, compiled, dtype) for n in sizes]


def ratios(rows: list[dict]) -> list[dict]:
    """Per n and library module (compiled ones too, if measured): its time, its plain expression's,
    the ratio and its target."""
    out = []
    for row in rows:
        for label in row["seconds"]:
            base = base_label(label)
            if base in TARGETS:
                mine, theirs = row["seconds"][label], row["seconds"][PLAIN[base]]
                out.append(
                    {
                        "n": row["n"],
                        "loss": label,
                        "plain": PLAIN[base],
                        "ratio": row["ratios"][label] if "ratios" in row else mine / theirs,
                        "target": TARGETS[base],
                    }
                )
    return out


def worst(rows: list[dict]) -> dict:
    """The ratio furthest above its target (ratio / target largest), of the modules as the library gives them."""
    return max(defaults(rows), key=lambda r: r["ratio"] / r["target"])


def defaults(rows: list[dict]) -> list[dict]:
    return [r for r in ratios(rows) if r["loss"] in TARGETS]


def render(result: dict) -> str:
    """The against-torch table of a stored result (``topk_against_torch_<device>``)."""
    rows, config = result["result"]["rows"], result["config"]
    one_process = config["device"].startswith("cuda")
    hardware = machine_label(
        config["device"], None if one_process else config["threads"] or None, result["provenance"]["hardware"]
    )
    command, k_fraction, dtype = result["command"], config["k"], config.get("dtype", "float32")
    ns = [row["n"] for row in rows]
    labels = sorted(
        (label for label in rows[0]["seconds"] if base_label(label) in TARGETS),
        key=lambda label: (list(TARGETS).index(base_label(label)), label != base_label(label)),
    )
    table = {(r["loss"], r["n"]): r for r in ratios(rows)}
    lines = [
        f"# The aggregates as the library gives them against the plain torch expression ({hardware})",
        "",
        f"Forward + backward on {dtype} losses, ratio of times (library / plain), k = {k_fraction}n; the median over rounds of "
        "the ratio of two adjacent loops (every other round the plain one first), "
        f"{'all n in one process' if one_process else 'each n in its own process'}. Produced by `{command}`.",
        "",
        "| loss | plain expression | target | " + " | ".join(f"n={n:,}" for n in ns) + " |",
        "|---|---|---|" + "---|" * len(ns),
    ]
    for label in labels:
        cells = [f"{table[(label, n)]['ratio']:.2f}" for n in ns]
        base = base_label(label)
        lines.append(f"| {label} | `{PLAIN[base]}` | ≤ {TARGETS[base]} | " + " | ".join(cells) + " |")
    if all(CONTROL in row.get("ratios", {}) for row in rows):
        cells = [f"{row['ratios'][CONTROL]:.2f}" for row in rows]
        lines.append(f"| control: {CONTROL} | `x.mean()` | none | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| plain expression | " + " | ".join(f"n={n:,}" for n in ns) + " |",
        "|---|" + "---|" * len(ns),
    ]
    for name in dict.fromkeys(PLAIN.values()):
        lines.append(f"| `{name}` (µs) | " + " | ".join(f"{row['seconds'][name] * 1e6:.3g}" for row in rows) + " |")
    lines += ["", headline(rows)]
    return "\n".join(lines) + "\n"


def headline(rows: list[dict]) -> str:
    """The benchmark's last line: the worst ratio over every n and loss, against its target."""
    w = worst(rows)
    verdict = "within" if all(r["ratio"] <= r["target"] for r in defaults(rows)) else "NOT within"
    return (
        f"worst ratio to the plain torch expression: {w['ratio']:.2f} ({w['loss']} / `{w['plain']}` at "
        f"n={w['n']:,}; target {w['target']}); every ratio {verdict} its target"
    )
