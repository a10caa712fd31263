"""Every differentiable top-k operator of ``configs/operator/`` side by side: speed, memory,
exactness and quality, measured in one run.

    python -m benchmarks operators --quick                    # < 1 min: our odd-even network vs difftopk's dense odd-even path
    python -m benchmarks operators [--device cpu|cuda] [--operators NAME ...] [--sizes 5 10 ...]
                                   [--large-sizes 10000 ...] [--repeats 20] [--memory-limit-gb 4]
                                   [--peer-batch 1] [--train-epochs 10] [--no-train]
                                   [--out-dir results/bench] [--tag NAME]
    python -m benchmarks render results/bench/operators_cpu.json   # draw the table + plot again, measuring nothing
    python -m benchmarks operators --k-sweep [--k-n 1000] [--operators NAME ...]  # only time and memory against k

``--quick`` times the forward+backward of the top-k cross-entropy with P_K = [.2]*5 on logits of
shape (128, 100) (the CIFAR-100 setting: logistic_phi, β = 0.5, λ_ART = 0.5) through this package's
odd-even DiffSortNet and through difftopk's, alternating, and prints the largest difference of their
P_topk; its last line is ``speedup vs difftopk: N``.

The full benchmark, each operator at its config's defaults (in its own process, so that the peak
resident memory is its own):

- time and memory of ``soft_topk`` forward+backward against n with k = n/2 at batch 1 (DFTopK's
  protocol: n = 5 … 1000), then ``--large-sizes`` for the operators whose cost allows it (an operator
  stops growing n once one call takes more than ``--max-seconds``). Warm-up calls are excluded;
  the median of ``--repeats`` calls is reported (CUDA: events around each call). Peak memory: on CUDA
  ``max_memory_allocated``; on a CPU the growth of the process's peak resident size over its
  baseline (so the largest size so far; allocator caching included).
- ours against every installed peer (:data:`PEERS`: difftopk's dense networks, NeuralSort and
  SoftSort, diffsort's networks, sparse top-k on torchsort's C++ PAV, and our own Python PAV), each
  pair in its own process at ``--sizes`` on ``--peer-batch`` rows: forward+backward of the same call
  on the same inputs, the two alternating in every round, their ratio and the largest difference of
  their outputs.
- a memory guard: every worker may grow by at most ``--memory-limit-gb`` (on a CPU its address
  space, so an allocation past the limit fails at once; on CUDA the caching allocator's share of the
  GPU); a call that would pass it is recorded as "skipped: over memory limit" and that operator or
  peer stops growing n.
- exactness at the default temperature on N(0, 1) scores of shape (128, 100), k = 5:
  ‖p − hard top-k‖₁ / k (row mean), max |Σp − k|, and the share of entries that are exactly 0 or 1.
- quality in training (operators that give a permutation): ``python train.py experiment=fmnistlt/topk_ce
  operator@individual.operator=<name> engine.epochs=<--train-epochs>``, seed 0: test top-1 / top-5.

Writes ``operators_<tag>.{json,md,png}`` (tag: the device, or ``--tag``); the JSON is a result
envelope with the command, the arguments and the provenance. ``--k-sweep`` instead times ``soft_topk``
forward+backward of one row of ``--k-n`` scores at k = 1 and 1 %, 10 %, 50 % and 90 % of n, each operator in
its own process (time and peak memory as above), and writes ``operators_k_<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import cache, partial
from pathlib import Path

from benchmarks.harness import bench_device
from benchmarks.harness.compare import interleaved, medians
from benchmarks.harness.isolation import WorkerFailed, project_root, run_isolated
from benchmarks.harness.memory import (
    cuda_peak_bytes,
    current_rss_bytes,
    max_rss_mb,
    peak_rss_bytes,
    reset_cuda_peak,
    reset_peak_rss,
)
from benchmarks.harness.output import Measured, device_tag
from benchmarks.harness.timing import Timer, is_cuda, median
from topklab.utils.errors import TopklabError

ROOT = project_root()
CONFIGS = ROOT / "configs" / "operator"
SMALL_SIZES = (5, 10, 50, 100, 500, 1000)
LARGE_SIZES = (10_000, 100_000, 1_000_000)
QUICK = dict(batch=128, classes=100, p_k=[0.2] * 5, steepness=0.5, distribution="logistic_phi", art_lambda=0.5)
MEMORY_LIMIT_GB = 4.0
OVER_MEMORY = "skipped: over memory limit"
# (our configs/operator/ name, the peer, the package it needs): the same function computed by another library
PEERS = (
    ("odd_even", "difftopk", "difftopk"),
    ("odd_even", "diffsort", "diffsort"),
    ("bitonic", "difftopk", "difftopk"),
    ("bitonic", "diffsort", "diffsort"),
    ("neuralsort", "difftopk", "difftopk"),
    ("softsort", "difftopk", "difftopk"),
    ("sparse_topk", "torchsort", "torchsort"),
    ("sparse_topk", "python_pav", "topklab"),  # not a peer: the Python PAV that the C++ one replaced
)
PEER_LABELS = {
    ("odd_even", "difftopk"): "difftopk DiffTopkNet, dense",
    ("bitonic", "difftopk"): "difftopk DiffTopkNet, dense",
    ("odd_even", "diffsort"): "diffsort DiffSortNet (n × n), top k columns",
    ("bitonic", "diffsort"): "diffsort DiffSortNet (n × n), top k columns",
    ("neuralsort", "difftopk"): "difftopk NeuralSort (n × n), top k columns",
    ("softsort", "difftopk"): "difftopk SoftSort (n × n), top k columns",
    ("sparse_topk", "torchsort"): "the same mask on torchsort's C++ PAV (isotonic_l2)",
    ("sparse_topk", "python_pav"): "ours with kernel='python' (the Python PAV)",
}


def operator_names() -> list[str]:
    return sorted(path.stem for path in CONFIGS.glob("*.yaml"))


def build_operator(name: str):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(CONFIGS / f"{name}.yaml"))


def forward_backward(operator, scores, k: int, weights, output: str):
    """One differentiable call and a backward through a fixed random linear functional."""
    scores.grad = None
    result = operator.permutation(scores, k) if output == "permutation" else operator.soft_topk(scores, k)
    (result * weights).sum().backward()


def guard_memory(limit_gb: float, device: str) -> None:
    """Let this process grow by at most ``limit_gb`` GiB from now on: on a CPU its address space
    (``RLIMIT_AS`` at its size now plus the limit, so an allocation past it fails at once, with an
    error, instead of driving the machine into swap); on CUDA the caching allocator's share of the GPU."""
    import torch

    limit = int(limit_gb * 2**30)
    if is_cuda(device):
        index = torch.device(device).index or 0
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved(index) + limit) / total), index)
        return
    with open("/proc/self/statm") as handle:
        size = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + limit if hard == resource.RLIM_INFINITY else min(size + limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def over_memory(error: BaseException) -> bool:
    """Whether an error is an allocation that failed (the guard's limit, or the device's memory)."""
    text = str(error).lower()
    return isinstance(error, MemoryError) or any(
        words in text for words in ("can't allocate memory", "out of memory", "bad_alloc")
    )


def failed_row(err: BaseException) -> dict:
    """What a call that raised records: over the memory limit, or the error's first line."""
    return {"skipped": OVER_MEMORY} if over_memory(err) else {"error": (str(err).splitlines() or [repr(err)])[0]}


def quick(args) -> dict:
    """Top-k CE forward+backward through our odd-even network and difftopk's, alternating rounds."""
    import torch

    from topklab.losses import TopKCrossEntropy
    from topklab.operators import DiffSortNet, DifftopkNetwork

    torch.manual_seed(0)
    q = QUICK
    logits = torch.randn(q["batch"], q["classes"], device=args.device, requires_grad=True)
    labels = torch.randint(0, q["classes"], (q["batch"],), device=args.device)
    settings = dict(steepness=q["steepness"], distribution=q["distribution"], art_lambda=q["art_lambda"])
    operators = {"ours": DiffSortNet("odd_even", **settings), "difftopk": DifftopkNetwork("odd_even", **settings)}
    losses = {
        name: TopKCrossEntropy(q["p_k"], op, top1_mode="smce", num_classes=q["classes"])
        for name, op in operators.items()
    }
    timer = Timer(args.device)

    def step(name):
        logits.grad = None
        losses[name](logits, labels).mean().backward()

    # one untimed round first builds the networks; then alternating rounds
    times, _ = interleaved(
        {name: (lambda name=name: step(name)) for name in losses}, args.quick_rounds, timer.timed, warmup=1
    )
    with torch.no_grad():
        difference = (
            (operators["ours"].permutation(logits, 5) - operators["difftopk"].permutation(logits, 5)).abs().max()
        )
    middle = medians(times)
    return {
        "ours_ms": middle["ours"] * 1e3,
        "difftopk_ms": middle["difftopk"] * 1e3,
        "speedup": middle["difftopk"] / middle["ours"],
        "max_abs_difference": float(difference),
        "rounds": args.quick_rounds,
        **{k: v for k, v in q.items()},
    }


def measure_operator(args) -> dict:
    """One operator's rows (runs in its own process)."""
    import torch

    from topklab.operators import TopKOperator, hard_topk

    torch.manual_seed(0)
    operator = build_operator(args.operator)
    # an operator whose soft top-k is its permutation's row sums holds n·k (= n²/2) entries per layer
    # or iteration: past n = 1000 it would exhaust memory before the time budget could stop it
    direct = type(operator)._soft_topk is not TopKOperator._soft_topk
    timer = Timer(args.device)
    output = "permutation" if operator.gives_permutation else "soft_topk"
    warm = torch.randn(1, 5, device=args.device, requires_grad=True)
    forward_backward(
        operator, warm, 2, torch.randn(1, 5, device=args.device), "soft_topk"
    )  # autograd's first-use setup
    guard_memory(args.memory_limit_gb, args.device)
    baseline = max_rss_mb()
    speed = []
    for n in [*args.sizes, *(args.large_sizes if direct else [])]:
        speed.append(timed_size(operator, n, max(1, n // 2), args, timer, baseline))
        if speed[-1].get("stopped") or speed[-1]["ms"] is None:
            break
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(128, 100, generator=generator).to(args.device)
    with torch.no_grad():
        p = operator.soft_topk(scores, 5)
        hard = hard_topk(scores, 5)
        exactness = {
            "l1_over_k": float(((p - hard).abs().sum(1) / 5).mean()),
            "sum_error": float((p.sum(1) - 5).abs().max()),
            "exact_01_share": float(((p == 0) | (p == 1)).float().mean()),
        }
    return {
        "operator": args.operator,
        "class": type(operator).__name__,
        "output": output,
        "direct_soft_topk": direct,
        "gives_permutation": operator.gives_permutation,
        "sums_to_k": operator.sums_to_k,
        "sparse": operator.sparse,
        "stochastic": operator.stochastic,
        "speed": speed,
        "exactness": exactness,
    }


def timed_size(operator, n: int, k: int, args, timer, baseline: float) -> dict:
    """``soft_topk`` forward+backward of one (1, n) row at k: the median time, its repeats and the peak memory
    (``stopped``: one call over the time budget; a row that says why where the call failed, e.g. over memory)."""
    import torch

    cuda = args.device.startswith("cuda")
    scores = torch.randn(1, n, device=args.device, requires_grad=True)
    weights = torch.randn(1, n, device=args.device)
    if cuda:
        reset_cuda_peak()
    try:
        call = partial(forward_backward, operator, scores, k, weights, "soft_topk")
        first = timer.once(call)
        if first > args.max_seconds:
            return {"n": n, "k": k, "ms": first * 1e3, "repeats": 1, "peak_mb": None, "stopped": True}
        for _ in range(args.warmup):
            call()
        repeats = max(3, min(args.repeats, int(args.max_seconds / max(first, 1e-6))))
        times = [timer.once(call) for _ in range(repeats)]
    except (RuntimeError, MemoryError) as err:  # over the memory limit at this size: the row says so
        return {"n": n, "k": k, "ms": None, "repeats": 0, "peak_mb": None, **failed_row(err)}
    peak = cuda_peak_bytes() / 2**20 if cuda else max_rss_mb() - baseline
    return {"n": n, "k": k, "ms": median(times) * 1e3, "repeats": repeats, "peak_mb": peak}


K_FRACTIONS = (0.01, 0.1, 0.5, 0.9)  # --k-sweep: k = 1 and these fractions of n


def measure_k(args) -> dict:
    """One operator's time and peak memory against k at n = ``args.k_n`` (runs in its own process)."""
    import torch

    torch.manual_seed(0)
    operator = build_operator(args.operator)
    timer = Timer(args.device)
    forward_backward(
        operator,
        torch.randn(1, 5, device=args.device, requires_grad=True),
        2,
        torch.randn(1, 5, device=args.device),
        "soft_topk",
    )  # autograd's first-use setup
    guard_memory(args.memory_limit_gb, args.device)
    baseline = max_rss_mb()
    n = args.k_n
    speed = []
    for k in sorted({1, *(max(1, round(f * n)) for f in K_FRACTIONS)}):
        speed.append(timed_size(operator, n, k, args, timer, baseline))
        if speed[-1].get("stopped") or speed[-1]["ms"] is None:
            break
    return {"operator": args.operator, "n": n, "speed": speed}


def measure_k_options(options: dict) -> dict:
    """:func:`measure_k` with the command line's options as a dict (the isolated worker's entry)."""
    return measure_k(argparse.Namespace(**options))


def render_k(result: dict) -> str:
    """The table of ``--k-sweep``: time and peak memory of each operator against k at one n."""
    out = result["result"]
    ks = sorted({s["k"] for r in out["rows"] for s in r["speed"]})
    n = out["n"]
    head = "| operator | " + " | ".join(f"k={k:,}" for k in ks) + " |"
    rule = "|---|" + "---|" * len(ks)
    times, memory = [head, rule], [head, rule]
    for row in out["rows"]:
        by_k = {s["k"]: s for s in row["speed"]}
        times.append(f"| {row['operator']} | " + " | ".join(speed_cell(by_k.get(k)) for k in ks) + " |")
        cells = [by_k.get(k, {}).get("peak_mb") for k in ks]
        memory.append(f"| {row['operator']} | " + " | ".join("—" if c is None else f"{c:.1f}" for c in cells) + " |")
    return "\n".join(
        [
            f"# Differentiable top-k operators against k ({out['device']}, {out['threads']} torch threads)",
            "",
            f"Produced by `{result['command']}` (torch {out['torch']}); each operator at its `configs/operator/` defaults, "
            f"`soft_topk` forward+backward of one row of n = {n:,} N(0, 1) scores, median after warm-up (an operator "
            "stops at the first k whose one call takes longer than its budget: (stopped)).",
            "",
            "## Time (ms)",
            "",
            *times,
            "",
            "## Peak memory (MB; CPU: growth of the process's peak resident size over its baseline, the largest so far)",
            "",
            *memory,
            "",
        ]
    )


def measure_operator_options(options: dict) -> dict:
    """:func:`measure` with the command line's options as a dict (the isolated worker's entry)."""
    return measure_operator(argparse.Namespace(**options))


@cache
def torchsort_isotonic():
    """torchsort's C++ isotonic regression ``argmin_{v_1 >= … >= v_n} ½‖v − y‖²`` of each row, forward
    and backward, as a torch.autograd.Function (torchsort is optional: imported here)."""
    import torch
    from torchsort import ops

    class TorchsortIsotonic(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            solution = ops.isotonic_l2[y.device.type](y)
            ctx.save_for_backward(y, solution)
            return solution

        @staticmethod
        def backward(ctx, grad):
            y, solution = ctx.saved_tensors
            return ops.isotonic_l2_backward[y.device.type](y, solution, grad.contiguous())

    return TorchsortIsotonic


def torchsort_sparse_topk(regularization: float):
    """SparseTopK's p = 2 mask on torchsort's PAV: the scores sorted, ``t = (s − s_[k])/ℓ`` (as
    SparseTopK computes it), v the isotonic regression of ``t − w`` by torchsort (C++, forward and
    backward), ``clip(t − v, 0, 1)``."""
    import torch

    def soft_topk(scores, k: int):
        ordered, order = torch.sort(scores, dim=1, descending=True, stable=True)
        t = (ordered - ordered[:, k - 1 : k].detach()) / regularization
        w = (torch.arange(scores.shape[1], device=scores.device) < k).to(scores.dtype)
        mask = (t - torchsort_isotonic().apply(t - w)).clamp(0.0, 1.0)
        return torch.empty_like(mask).scatter(1, order, mask)

    return soft_topk


def top_columns(full, k: int):
    """The k columns of a (batch, n, n) ascending sort's permutation that ours gives: the top-1 first."""
    return full[:, :, -k:].flip(-1)


def peer_function(name: str, peer: str, operator):
    """The peer's ``(scores, k) -> output``, the output our operator ``name`` gives: the permutation
    (batch, n, k) with column 0 the top-1, or sparse top-k's mask (batch, n)."""
    from topklab.operators import DifftopkNetwork, SparseTopK
    from topklab.operators.difftopk_network import difftopk_module

    if peer == "python_pav":
        return SparseTopK(operator.regularization, p=operator.p, kernel="python").soft_topk
    if peer == "torchsort":
        return torchsort_sparse_topk(operator.regularization)
    if name in ("neuralsort", "softsort"):
        difftopk = difftopk_module()
        if name == "neuralsort":
            sorter = difftopk.NeuralSort(tau=operator.tau)
            return lambda scores, k: top_columns(sorter(scores), k)
        sorter = difftopk.SoftSort(tau=operator.tau, pow=operator.power)
        return lambda scores, k: top_columns(sorter(-scores).transpose(-2, -1), k)
    settings = dict(steepness=operator.steepness, distribution=operator.distribution, art_lambda=operator.art_lambda)
    if peer == "difftopk":
        return DifftopkNetwork(operator.network, **settings).permutation
    import diffsort

    networks = {}

    def permutation(scores, k: int):
        n = scores.shape[1]
        if n not in networks:
            networks[n] = diffsort.DiffSortNet(operator.network, n, device=str(scores.device), **settings)
        return top_columns(networks[n](scores)[1], k)

    return permutation


def peak_call(call, cuda: bool) -> tuple[object, float]:
    """(what the call returned, the call's peak memory in MiB above the memory before it)."""
    if cuda:
        import torch

        reset_cuda_peak()
        before = torch.cuda.memory_allocated()
    else:
        reset_peak_rss()
        before = current_rss_bytes()
    out = call()
    peak = (cuda_peak_bytes() if cuda else peak_rss_bytes()) - before
    return out, max(peak, 0) / 2**20


def measure_peer(args) -> dict:
    """Our operator ``args.operator`` against ``args.peer`` at each n (runs in its own process)."""
    import torch

    torch.manual_seed(0)
    operator = build_operator(args.operator)
    output = "soft_topk" if args.operator == "sparse_topk" else "permutation"
    functions = {"ours": getattr(operator, output), "peer": peer_function(args.operator, args.peer, operator)}
    cuda = is_cuda(args.device)
    timer = Timer(args.device)

    def step(function, scores, k, weights):
        scores.grad = None
        out = function(scores, k)
        (out * weights).sum().backward()
        return out.detach()

    for function in functions.values():  # autograd's first-use setup
        step(function, torch.randn(1, 5, device=args.device, requires_grad=True), 2, 1.0)
    guard_memory(args.memory_limit_gb, args.device)
    rows = []
    for n in args.sizes:
        k = max(1, n // 2)
        scores = torch.randn(args.peer_batch, n, device=args.device, requires_grad=True)
        weights = torch.randn(args.peer_batch, n, *((k,) if output == "permutation" else ()), device=args.device)
        calls = {name: partial(step, function, scores, k, weights) for name, function in functions.items()}
        row, first, outs = {"n": n, "k": k, "batch": args.peer_batch}, {}, {}
        for name, call in calls.items():
            try:  # an untimed first call (a peer builds its network for n there), then one timed call
                outs[name], row[f"{name}_peak_mb"] = peak_call(call, cuda)
                first[name] = timer.once(call)
            except (RuntimeError, MemoryError) as err:
                row[name] = failed_row(err)
                break
        row.update({f"{name}_ms": seconds * 1e3 for name, seconds in first.items()}, repeats=1)
        if len(first) < 2:
            rows.append(row)
            break
        row["max_abs_difference"] = float((outs["ours"] - outs["peer"]).abs().max())
        row["peer_over_ours"] = first["peer"] / first["ours"]
        if max(first.values()) > args.max_seconds:
            rows.append({**row, "stopped": True})
            break
        repeats = max(3, min(args.repeats, int(args.max_seconds / max(sum(first.values()), 1e-6))))
        times, _ = interleaved(calls, repeats, timer.timed, warmup=args.warmup)
        middle = medians(times)
        row.update(ours_ms=middle["ours"] * 1e3, peer_ms=middle["peer"] * 1e3, repeats=repeats)
        row["peer_over_ours"] = middle["peer"] / middle["ours"]
        rows.append(row)
    return {"operator": args.operator, "peer": args.peer, "output": output, "sizes": rows}


def measure_peer_options(options: dict) -> dict:
    """:func:`measure_peer` with the command line's options as a dict (the isolated worker's entry)."""
    return measure_peer(argparse.Namespace(**options))


def compare_peers(args, names: list[str]) -> list[dict]:
    """Every pair of :data:`PEERS` whose operator is in ``names``: measured in its own process, or
    why not (the peer's package is not installed, the worker failed)."""
    pairs = []
    for name, peer, package in PEERS:
        if name not in names:
            continue
        pair = {"operator": name, "peer": peer, "label": PEER_LABELS[(name, peer)], "package": package}
        if importlib.util.find_spec(package) is None:
            pairs.append({**pair, "error": "not installed"})
            continue
        try:
            result = run_isolated(
                "benchmarks.operators:measure_peer_options", {**vars(args), "operator": name, "peer": peer}
            )
        except WorkerFailed as err:  # recorded; the other pairs still run
            pairs.append({**pair, "error": str(err)})
        else:
            pairs.append({**pair, **result})
        print(peer_line(pairs[-1]), flush=True)
    return pairs


def train_quality(name: str, epochs: int, threads: int) -> dict:
    """Test top-1 / top-5 of a short fmnistlt run with the top-k CE through ``name``."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        command = [
            sys.executable,
            str(ROOT / "train.py"),
            "experiment=fmnistlt/topk_ce",
            "seed=0",
            f"operator@individual.operator={name}",
            f"engine.epochs={epochs}",
            f"result_file={result_file}",
            f"paths.log_dir={tmp}/logs",
        ]
        began = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)}
        )
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return {"error": lines[-1] if lines else f"exit {done.returncode}"}
        test = json.loads(result_file.read_text())["result"]["summary"]["metrics"]["test"]
        return {"top1": test["top1"], "top5": test["top5"], "epochs": epochs, "wall_s": time.perf_counter() - began}


def arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="only our odd-even network against difftopk's")
    parser.add_argument("--quick-rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--operators", nargs="+", default=None, help="configs/operator/ names (default: all)")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SMALL_SIZES))
    parser.add_argument("--large-sizes", nargs="*", type=int, default=list(LARGE_SIZES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=5.0, help="stop growing n once one call takes longer")
    parser.add_argument("--peer-batch", type=int, default=1, help="rows of the scores in the table against the peers")
    parser.add_argument(
        "--memory-limit-gb",
        type=float,
        default=MEMORY_LIMIT_GB,
        help="the most each worker may grow (GiB); a call past it is 'skipped: over memory limit'",
    )
    parser.add_argument("--train-epochs", type=int, default=10)
    parser.add_argument("--train-threads", type=int, default=2)
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--tag", default=None)
    parser.add_argument("--k-sweep", action="store_true", help="only time and memory against k at n = --k-n")
    parser.add_argument("--k-n", type=int, default=1000, help="the row length of --k-sweep")


def measure(args) -> Measured | int:
    if args.memory_limit_gb <= 0:
        raise TopklabError(f"--memory-limit-gb {args.memory_limit_gb} must be > 0")
    if args.peer_batch < 1:
        raise TopklabError(f"--peer-batch {args.peer_batch} must be >= 1")
    bench_device(args.device)
    known = operator_names()
    unknown = sorted(set(args.operators or []) - set(known))
    if unknown:
        raise TopklabError(f"unknown operator(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    import torch

    if args.k_sweep:
        return k_sweep(args)
    if args.quick:
        result = quick(args)
        print(
            f"top-k CE (P_K = [.2]*5, batch {result['batch']}, n = {result['classes']}) forward+backward: "
            f"ours {result['ours_ms']:.1f} ms, difftopk's dense odd-even path {result['difftopk_ms']:.1f} ms "
            f"(median of {result['rounds']}, {torch.get_num_threads()} threads); "
            f"max |P_topk difference| {result['max_abs_difference']:.1e}"
        )
        print(f"speedup vs difftopk: {result['speedup']:.1f}")
        return 0
    rows, failed = [], []
    names = args.operators or known
    for name in names:
        try:  # each operator in its own process
            row = run_isolated("benchmarks.operators:measure_operator_options", {**vars(args), "operator": name})
        except WorkerFailed as err:  # recorded; the other operators still run
            print(f"error: operator {name} failed: {err}", file=sys.stderr)
            failed.append({"operator": name, "error": str(err)})
            continue
        if row["gives_permutation"] and not args.no_train and name != "difftopk_network":
            row["training"] = train_quality(name, args.train_epochs, args.train_threads)
        rows.append(row)
        print(summary_line(row), flush=True)
    peers = compare_peers(args, names)
    head_to_head = quick(argparse.Namespace(device=args.device, quick_rounds=args.quick_rounds))
    out = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "failed": failed,
        "peers": peers,
        "memory_limit_gb": args.memory_limit_gb,
        "peer_batch": args.peer_batch,
        "head_to_head": head_to_head,
        "train_epochs": None if args.no_train else args.train_epochs,
    }
    return Measured(
        f"operators_{args.tag or device_tag(args.device)}",
        out,
        settings(args),
        Path(args.out_dir),
        summary=f"speedup vs difftopk: {head_to_head['speedup']:.1f}",
    )


def settings(args) -> dict:
    """The options that determine the numbers (no machine paths)."""
    return {k: v for k, v in vars(args).items() if k not in ("out_dir", "operator", "command")}


def k_sweep(args) -> Measured:
    """``--k-sweep``: every operator against k at one n, each in its own process (``operators_k_<tag>``)."""
    import torch

    rows = []
    for name in args.operators or operator_names():
        try:
            row = run_isolated("benchmarks.operators:measure_k_options", {**vars(args), "operator": name})
        except WorkerFailed as err:  # recorded; the other operators still run
            print(f"error: operator {name} failed: {err}", file=sys.stderr)
            continue
        rows.append(row)
        print(f"{name:20s} " + ", ".join(f"k={s['k']}: {speed_cell(s)} ms" for s in row["speed"]), flush=True)
    out = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "n": args.k_n,
        "rows": rows,
    }
    tag = args.tag or device_tag(args.device)
    return Measured(f"operators_k_{tag}", out, settings(args), Path(args.out_dir))


def render(result: dict) -> str:
    """The table of a stored result: the k sweep (``operators_k_<tag>``) or the full benchmark."""
    if result["config"].get("k_sweep"):
        return render_k(result)
    return render_full(result)


def device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def summary_line(row: dict) -> str:
    at = {s["n"]: s for s in row["speed"]}
    ms = at.get(1000, {}).get("ms")
    e = row["exactness"]
    training = row.get("training") or {}
    trained = (
        f"top1 {training['top1']:.2f} top5 {training['top5']:.2f}" if "top1" in training else training.get("error", "")
    )
    largest = max((s["n"] for s in row["speed"] if s.get("ms") is not None and not s.get("stopped")), default=0)
    skipped = "".join(f"  n={s['n']:,} {s['skipped']}" for s in row["speed"] if s.get("skipped"))
    return (
        f"{row['operator']:20s} n=1000: {ms if ms is None else round(ms, 2)} ms  largest n {largest:,}{skipped}  "
        f"|p-hard|/k {e['l1_over_k']:.3f}  |sum-k| {e['sum_error']:.1e}  exact 0/1 {e['exact_01_share']:.0%}  {trained}"
    )


def peer_state(size: dict) -> str | None:
    """Why a size of a pair has no ratio ("skipped: over memory limit", an error), or None."""
    for side in ("peer", "ours"):
        if side in size:
            reason = size[side].get("skipped") or f"error: {size[side]['error']}"
            return f"{reason} ({'the peer' if side == 'peer' else 'ours'})"
    return None


def peer_line(pair: dict) -> str:
    head = f"{pair['operator']:12s} vs {pair['peer']:10s}"
    if "error" in pair:
        return f"{head} {pair['error']}"
    cells = []
    for size in pair["sizes"]:
        state = peer_state(size)
        ratio = f"{size.get('peer_over_ours', 0):.2f}×" + (
            " (one call, stopped: over time)" if size.get("stopped") else ""
        )
        cells.append(f"n={size['n']}: {state or ratio}")
    return f"{head} peer/ours " + ", ".join(cells)


def render_peers(out: dict) -> list[str]:
    """The markdown section of ours against every installed peer."""
    pairs = out.get("peers") or []
    if not pairs:
        return []
    limit = out.get("memory_limit_gb", MEMORY_LIMIT_GB)
    batch = out.get("peer_batch", 1)
    lines = [
        "## Ours against every installed peer, side by side",
        "",
        f"Forward+backward of the same call on the same inputs (scores (B, n) with B = {batch}, k = n/2: the (B, n, k) "
        "permutation of a sorting operator, sparse top-k's mask), after one untimed call each (a peer builds its "
        "network for n there), ours and the peer alternating in each round, median of the rounds. "
        "peer / ours > 1: ours is faster. Each pair runs in its own process, which may grow by at most "
        f"{limit:g} GiB (`--memory-limit-gb`): a call past it is skipped; a call over the time budget stops the pair "
        "(one call timed). Peak: the call's peak memory above the process's memory before it (CPU: resident size).",
        "",
        "| ours | peer | n | ours (ms) | peer (ms) | peer / ours | max abs difference | ours peak (MB) | peer peak (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    missing = []
    for pair in pairs:
        if "error" in pair:
            missing.append(f"{pair['peer']} for {pair['operator']} ({pair['error']})")
            continue
        for size in pair["sizes"]:
            state = peer_state(size)
            head = f"| {pair['operator']} | {pair['label']} | {size['n']:,} |"
            if state:
                ours = f"{size['ours_ms']:.3g}" if "ours_ms" in size else "—"
                lines.append(f"{head} {ours} | {state} | — | — | — | — |")
                continue
            ratio = f"{size['peer_over_ours']:.2f}" + (" (one call, stopped: over time)" if size.get("stopped") else "")
            lines.append(
                f"{head} {size['ours_ms']:.3g} | {size['peer_ms']:.3g} | {ratio} | {size['max_abs_difference']:.1e} | "
                f"{size['ours_peak_mb']:.1f} | {size['peer_peak_mb']:.1f} |"
            )
    if missing:
        lines += ["", "Not measured: " + "; ".join(missing) + "."]
    return [*lines, ""]


def speed_cell(size: dict | None) -> str:
    """A cell of the time table: the median, the one call that stopped the operator, or why none."""
    if size is None:
        return "—"
    if size.get("skipped"):
        return size["skipped"]
    if size.get("ms") is None:
        return "—"
    return f">{size['ms']:.0f} (stopped)" if size.get("stopped") else f"{size['ms']:.3g}"


def render_full(result: dict) -> str:
    out, plot_name = result["result"], f"{result['experiment']}.png"
    rows = out["rows"]
    sizes = sorted({s["n"] for r in rows for s in r["speed"]})
    h = out["head_to_head"]
    guard = (
        f" or would grow its process by more than {out['memory_limit_gb']:g} GiB (skipped: over memory limit)"
        if "memory_limit_gb" in out
        else ""
    )
    lines = [
        f"# Differentiable top-k operators side by side ({out['device']}, {out['threads']} torch threads)",
        "",
        f"Produced by `{result['command']}` (torch {out['torch']}); each operator at its `configs/operator/` defaults.",
        "",
        "## Our odd-even DiffSortNet against difftopk's dense odd-even path",
        "",
        f"Top-k cross-entropy, P_K = [.2]*5, logits (128, 100), logistic_phi, β = 0.5, λ_ART = 0.5, forward+backward, "
        f"median of {h['rounds']} alternating rounds: **ours {h['ours_ms']:.1f} ms, difftopk {h['difftopk_ms']:.1f} ms, "
        f"speedup {h['speedup']:.1f}×**; largest |P_topk difference| {h['max_abs_difference']:.1e}.",
        "",
        *render_peers(out),
        "## Time of `soft_topk` forward+backward (ms), batch 1, k = n/2",
        "",
        f"Median after warm-up; an operator stops growing n once one call takes more than its budget (—: not run)"
        f"{guard}. Past n = 1,000 only the operators with a direct soft top-k run (the others sum an n × k permutation). "
        f"Plot: `{plot_name}`.",
        "",
        "| operator | " + " | ".join(f"n={n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for r in rows:
        at = {s["n"]: s for s in r["speed"]}
        lines.append(f"| {r['operator']} | " + " | ".join(speed_cell(at.get(n)) for n in sizes) + " |")
    lines += [
        "",
        "## Peak memory of the same calls (MB)",
        "",
        "CPU: growth of the process's peak resident size over its baseline (the largest size so far, allocator "
        "caching included); CUDA: `max_memory_allocated`.",
        "",
        "| operator | " + " | ".join(f"n={n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for r in rows:
        at = {s["n"]: s for s in r["speed"]}
        cells = ["—" if at.get(n) is None or at[n].get("peak_mb") is None else f"{at[n]['peak_mb']:.1f}" for n in sizes]
        lines.append(f"| {r['operator']} | " + " | ".join(cells) + " |")
    training = (
        "Training: `python train.py experiment=fmnistlt/topk_ce operator@individual.operator=<name> "
        f"engine.epochs={out['train_epochs']}` seed 0, test accuracy at the best validation top-1 (operators with "
        "a permutation; difftopk_network is the same permutation as odd_even, slower)."
        if out["train_epochs"]
        else "Training: not run (`--no-train`)."
    )
    lines += [
        "",
        "## Exactness at the default temperature and quality in training",
        "",
        f"N(0, 1) scores (128, 100), k = 5. {training}",
        "",
        "| operator | output | Σp = k promised | ‖p − hard‖₁ / k | max abs(Σp − k) | exact 0/1 share | test top-1 | test top-5 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, t = r["exactness"], r.get("training") or {}
        top = (
            f"{t['top1']:.2f} | {t['top5']:.2f}"
            if "top1" in t
            else (f"failed: {t['error']} | " if "error" in t else "— | —")
        )
        lines.append(
            f"| {r['operator']} | {r['output']} | {'yes' if r['sums_to_k'] else 'no'} | {e['l1_over_k']:.3f} | "
            f"{e['sum_error']:.1e} | {e['exact_01_share']:.0%} | {top} |"
        )
    if out["failed"]:
        lines += ["", "Failed: " + "; ".join(f"{f['operator']} ({f['error']})" for f in out["failed"]) + "."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Time and peak memory against n of every operator (the full benchmark; none for the k sweep)."""
    if result["config"].get("k_sweep"):
        return False
    rows, device = result["result"]["rows"], result["result"]["device"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    markers = "os^vDP*Xh<>p"
    for index, r in enumerate(rows):
        points = [
            (s["n"], s["ms"], s.get("peak_mb")) for s in r["speed"] if s.get("ms") is not None and not s.get("stopped")
        ]
        if not points:
            continue
        style = dict(marker=markers[index % len(markers)], linestyle=("-", "--", ":")[index % 3], label=r["operator"])
        axes[0].plot([p[0] for p in points], [p[1] for p in points], **style)
        memory = [(p[0], p[2]) for p in points if p[2] is not None and p[2] > 0]
        if memory:
            axes[1].plot([m[0] for m in memory], [m[1] for m in memory], **style)
    for axis, label in zip(axes, ("forward+backward (ms)", "peak memory (MB)")):
        axis.set_xscale("log"), axis.set_yscale("log"), axis.set_xlabel("n (k = n/2, batch 1)"), axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7, ncol=2)
    figure.suptitle(f"soft top-k operators, {device}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
