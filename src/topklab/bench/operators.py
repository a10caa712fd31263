"""``scripts/bench_operators.py``: every differentiable top-k operator of ``configs/operator/`` side by side: speed, memory,
exactness and quality, measured in one run.

    python scripts/bench_operators.py --quick                    # < 1 min: our odd-even network vs difftopk's dense odd-even path
    python scripts/bench_operators.py [--device cpu|cuda] [--operators NAME ...] [--sizes 5 10 ...]
                                      [--large-sizes 10000 ...] [--repeats 20] [--train-epochs 10]
                                      [--no-train] [--out-dir results/bench] [--tag NAME]
    python scripts/bench_operators.py --render results/bench/operators_cpu.json   # redraw table + plot only

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
- exactness at the default temperature on N(0, 1) scores of shape (128, 100), k = 5:
  ‖p − hard top-k‖₁ / k (row mean), max |Σp − k|, and the share of entries that are exactly 0 or 1.
- quality in training (operators that give a permutation): ``python train.py experiment=fmnistlt/topk_ce
  operator@individual.operator=<name> engine.epochs=<--train-epochs>``, seed 0: test top-1 / top-5.

Writes ``operators_<tag>.{json,md,png}`` (tag: the device, or ``--tag``); the JSON is a result
envelope with the command, the arguments and the provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from topklab.bench.compare import interleaved, medians
from topklab.bench.isolation import WorkerFailed, project_root, run_isolated
from topklab.bench.memory import cuda_peak_bytes, max_rss_mb, reset_cuda_peak
from topklab.bench.output import command_line, write_outputs
from topklab.bench.timing import Timer, median

ROOT = project_root()
CONFIGS = ROOT / "configs" / "operator"
SMALL_SIZES = (5, 10, 50, 100, 500, 1000)
LARGE_SIZES = (10_000, 100_000, 1_000_000)
QUICK = dict(batch=128, classes=100, p_k=[0.2] * 5, steepness=0.5, distribution="logistic_phi", art_lambda=0.5)


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


def measure(args) -> dict:
    """One operator's rows (runs in its own process)."""
    import torch

    from topklab.operators import TopKOperator, hard_topk

    torch.manual_seed(0)
    operator = build_operator(args.operator)
    # an operator whose soft top-k is its permutation's row sums holds n·k (= n²/2) entries per layer
    # or iteration: past n = 1000 it would exhaust memory before the time budget could stop it
    direct = type(operator).soft_topk is not TopKOperator.soft_topk
    cuda = args.device.startswith("cuda")
    timer = Timer(args.device)
    output = "permutation" if operator.gives_permutation else "soft_topk"
    warm = torch.randn(1, 5, device=args.device, requires_grad=True)
    forward_backward(
        operator, warm, 2, torch.randn(1, 5, device=args.device), "soft_topk"
    )  # autograd's first-use setup
    baseline = max_rss_mb()
    speed = []
    for n in [*args.sizes, *(args.large_sizes if direct else [])]:
        k = max(1, n // 2)
        scores = torch.randn(1, n, device=args.device, requires_grad=True)
        weights = torch.randn(1, n, device=args.device)
        if cuda:
            reset_cuda_peak()
        try:
            call = partial(forward_backward, operator, scores, k, weights, "soft_topk")
            first = timer.once(call)
            if first > args.max_seconds:
                speed.append({"n": n, "k": k, "ms": first * 1e3, "repeats": 1, "peak_mb": None, "stopped": True})
                break
            for _ in range(args.warmup):
                call()
            repeats = max(3, min(args.repeats, int(args.max_seconds / max(first, 1e-6))))
            times = [timer.once(call) for _ in range(repeats)]
        except (RuntimeError, MemoryError) as err:  # out of memory at this size: the row says so
            speed.append({"n": n, "k": k, "ms": None, "repeats": 0, "peak_mb": None, "error": str(err).splitlines()[0]})
            break
        peak = cuda_peak_bytes() / 2**20 if cuda else max_rss_mb() - baseline
        speed.append({"n": n, "k": k, "ms": median(times) * 1e3, "repeats": repeats, "peak_mb": peak})
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


def measure_options(options: dict) -> dict:
    """:func:`measure` with the command line's options as a dict (the isolated worker's entry)."""
    return measure(argparse.Namespace(**options))


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only our odd-even network against difftopk's")
    parser.add_argument("--quick-rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--operators", nargs="+", default=None, help="configs/operator/ names (default: all)")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SMALL_SIZES))
    parser.add_argument("--large-sizes", nargs="*", type=int, default=list(LARGE_SIZES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=5.0, help="stop growing n once one call takes longer")
    parser.add_argument("--train-epochs", type=int, default=10)
    parser.add_argument("--train-threads", type=int, default=2)
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--tag", default=None)
    parser.add_argument("--render", metavar="JSON", help="only redraw the table and plot of a result JSON")
    parser.add_argument("--operator", help=argparse.SUPPRESS)  # one operator, in a child process
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.render:
        return render_saved(Path(args.render))
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda but no CUDA device is visible; use --device cpu")
    known = operator_names()
    unknown = sorted(set(args.operators or []) - set(known))
    if unknown:
        parser.error(f"unknown operator(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.operator:
        print(json.dumps(measure(args)))
        return 0
    import torch

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
    for name in args.operators or known:
        try:  # each operator in its own process
            row = run_isolated("topklab.bench.operators:measure_options", {**vars(args), "operator": name})
        except WorkerFailed as err:  # recorded; the other operators still run
            print(f"error: operator {name} failed: {err}", file=sys.stderr)
            failed.append({"operator": name, "error": str(err)})
            continue
        if row["gives_permutation"] and not args.no_train and name != "difftopk_network":
            row["training"] = train_quality(name, args.train_epochs, args.train_threads)
        rows.append(row)
        print(summary_line(row), flush=True)
    head_to_head = quick(argparse.Namespace(device=args.device, quick_rounds=args.quick_rounds))
    out = {
        "command": command_line("bench_operators.py", argv),
        "device": device_name(args.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "failed": failed,
        "head_to_head": head_to_head,
        "train_epochs": None if args.no_train else args.train_epochs,
    }
    tag = args.tag or ("cuda" if args.device.startswith("cuda") else "cpu")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(rows, out_dir / f"operators_{tag}.png", out["device"])
    write_outputs(
        out_dir,
        f"operators_{tag}",
        out,
        out["command"],
        {k: v for k, v in vars(args).items() if k not in ("out_dir", "operator")},
        markdown=render(out, f"operators_{tag}.png"),
    )
    print(f"wrote {out_dir / f'operators_{tag}.md'}")
    print(f"speedup vs difftopk: {head_to_head['speedup']:.1f}")
    return 0


def render_saved(path: Path) -> int:
    """Redraw ``operators_<tag>.{md,png}`` beside a result JSON this script wrote (no measuring)."""
    from topklab.utils.io import atomic_write_text

    try:
        out = json.loads(path.read_text())["result"]
    except (OSError, ValueError, KeyError) as err:
        print(
            f"error: {path} is not a result JSON of this script ({err}); pass results/bench/operators_<tag>.json",
            file=sys.stderr,
        )
        return 2
    plot(out["rows"], path.with_suffix(".png"), out["device"])
    atomic_write_text(path.with_suffix(".md"), render(out, path.with_suffix(".png").name))
    print(f"wrote {path.with_suffix('.md')} and {path.with_suffix('.png').name}")
    return 0


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
    return (
        f"{row['operator']:20s} n=1000: {ms if ms is None else round(ms, 2)} ms  largest n {largest:,}  "
        f"|p-hard|/k {e['l1_over_k']:.3f}  |sum-k| {e['sum_error']:.1e}  exact 0/1 {e['exact_01_share']:.0%}  {trained}"
    )


def render(out: dict, plot_name: str) -> str:
    rows = out["rows"]
    sizes = sorted({s["n"] for r in rows for s in r["speed"]})
    h = out["head_to_head"]
    lines = [
        f"# Differentiable top-k operators side by side ({out['device']}, {out['threads']} torch threads)",
        "",
        f"Produced by `{out['command']}` (torch {out['torch']}); each operator at its `configs/operator/` defaults.",
        "",
        "## Our odd-even DiffSortNet against difftopk's dense odd-even path",
        "",
        f"Top-k cross-entropy, P_K = [.2]*5, logits (128, 100), logistic_phi, β = 0.5, λ_ART = 0.5, forward+backward, "
        f"median of {h['rounds']} alternating rounds: **ours {h['ours_ms']:.1f} ms, difftopk {h['difftopk_ms']:.1f} ms, "
        f"speedup {h['speedup']:.1f}×**; largest |P_topk difference| {h['max_abs_difference']:.1e}.",
        "",
        "## Time of `soft_topk` forward+backward (ms), batch 1, k = n/2",
        "",
        f"Median after warm-up; an operator stops growing n once one call takes more than its budget (—: not run). "
        f"Past n = 1,000 only the operators with a direct soft top-k run (the others sum an n × k permutation). "
        f"Plot: `{plot_name}`.",
        "",
        "| operator | " + " | ".join(f"n={n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for r in rows:
        at = {s["n"]: s for s in r["speed"]}
        cells = []
        for n in sizes:
            s = at.get(n)
            cells.append(
                "—"
                if s is None or s.get("ms") is None
                else (f">{s['ms']:.0f} (stopped)" if s.get("stopped") else f"{s['ms']:.3g}")
            )
        lines.append(f"| {r['operator']} | " + " | ".join(cells) + " |")
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


def plot(rows: list[dict], path: Path, device: str) -> None:
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
    axes[0].legend(fontsize=7, ncol=2)
    figure.suptitle(f"soft top-k operators, {device}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
