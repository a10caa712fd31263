"""The aggregate loss's share of a real training step: Average, ATk and STk (as the
configs run it, λ solved per batch; with ``loss.kernel=native``; and with the paper's gradient update of λ,
``loss.lam_update=gradient``, λ a parameter of the optimizer) inside the engine.

    python -m benchmarks step_share [--tabular-steps 2000] [--vision-steps 24] [--translation-steps 16]
                                    [--threads 1] [--workloads tabular vision translation]
                                    [--quick] [--data-dir .data] [--translation-override KEY=VALUE ...]
                                    [--out-dir results/bench]

Workloads: ``tabular``, the STk paper's 2-layer MLP on australian (its recipe: logistic loss,
AdaGrad, batch 16; ``loss=stk`` as the loss group gives it: the C++ kernel at every n);
``vision``, ResNet-32 on Fashion-MNIST-LT as the fmnistlt experiment rows train it
(``experiment=fmnistlt/la``, ``la_atk``, ``la_stk``: logit-adjusted CE, SGD, batch 128);
``translation``, the small Transformer on Multi30k as the multi30k rows train it
(``experiment=stk/multi30k/average``, ``atk``, ``stk``: one loss per target token, 2,048-token
batches; ``--translation-override dataset.root=DIR`` reads another corpus in Multi30k's layout). The
vision and translation rows keep ``compile_min_n: 16384``, the eager kernel their committed results ran.

Each workload runs in its own process on the CPU with ``--threads`` torch threads: every loss's model,
optimizer and data built as ``train.py`` builds them, and a :class:`~topklab.engine.loop.TrainingRun`
opened and started as :meth:`~topklab.engine.Engine.fit` starts it (full batches only). After the
workload's warm-up steps per loss, the engine's own training step (forward, backward, optimizer and
schedule steps; :meth:`~topklab.engine.loop.TrainingRun.train_step`) is timed alone, in pairs: each
loss's step right next to one of Average's (both on the same batch; :func:`pair_order` balances
who goes first and each loss's place in the round), ``--<workload>-steps`` pairs per loss. "Added vs Average" is
the median over the pairs of step_time(loss) / step_time(Average's step beside it) − 1: a pair's two
steps run back to back, so the machine's load, which drifts over seconds, mostly cancels. The loss share is the engine's step profile over the loss's timed
steps (the objective's forward over the step's compute). Writes ``step_share_cpu.{json,md}``; the
last line printed is the worst STk overhead over the workloads against the 5 % target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness.isolation import WorkerFailed, project_root, run_isolated
from benchmarks.harness.output import Measured
from topklab.report.outputs import machine_label

ROOT = project_root()

LOSSES = {
    "average": "Average",
    "atk": "ATk",
    "stk": "STk",
    "stk_native": "STk (kernel=native)",
    "stk_gradient": "STk (lam_update=gradient)",
}
# STk as the configs run it (λ solved per batch; the tabular workload's loss group: C++ kernel; the vision and
# translation rows: eager at their batch sizes, the committed results' path), with the C++ kernel, and with the
# paper's update (λ a parameter of the optimizer; the tabular presets train it so, on the eager kernel)
STK_ROWS = ("stk", "stk_native", "stk_gradient")
TARGET = 0.05  # STk may add at most 5 % to a step
# name: label, batch size, warm-up steps per loss, the loss-independent overrides, the overrides choosing each loss
WORKLOADS = {
    "tabular": {
        "label": "tabular MLP (australian; logistic, AdaGrad)",
        "batch_size": 16,
        "warmup_steps": 100,
        "overrides": [
            "dataset=australian",
            "engine.eval_every_steps=null",
            "engine.patience=null",
            "engine.validate_at_start=false",
            "engine.final_splits=[val]",
        ],
        "loss_overrides": {
            "average": ["loss=average"],
            "atk": ["loss=atk"],
            "stk": ["loss=stk"],
            "stk_native": ["loss=stk", "loss.kernel=native"],
            "stk_gradient": ["loss=stk", "loss.lam_update=gradient", "loss.lam_init=0.0"],
        },
    },
    "vision": {
        "label": "ResNet-32 on fmnistlt (LA individual loss, SGD)",
        "batch_size": 128,
        "warmup_steps": 2,
        # validation (outside the timed region) on 10 images per class instead of 50 only saves wall time
        "overrides": ["dataset.val_per_class=10", "engine.final_splits=[val]"],
        "loss_overrides": {
            "average": ["experiment=fmnistlt/la"],
            "atk": ["experiment=fmnistlt/la_atk"],
            "stk": ["experiment=fmnistlt/la_stk"],
            "stk_native": ["experiment=fmnistlt/la_stk", "loss.kernel=native"],
            "stk_gradient": ["experiment=fmnistlt/la_stk", "loss.lam_update=gradient"],
        },
    },
    "translation": {
        "label": "small Transformer on Multi30k (token losses, AdamW)",
        "batch_size": 2048,
        "warmup_steps": 2,
        # validation (outside the timed region) decodes one token per sentence, only to save wall time
        "overrides": [
            "engine.final_splits=[val]",
            "engine.average_last=0",
            "task.val_search.max_len_a=0",
            "task.val_search.max_len_b=1",
            "result_file=null",
        ],
        "loss_overrides": {
            "average": ["experiment=stk/multi30k/average"],
            "atk": ["experiment=stk/multi30k/atk"],
            "stk": ["experiment=stk/multi30k/stk"],
            "stk_native": ["experiment=stk/multi30k/stk", "loss.kernel=native"],
            "stk_gradient": ["experiment=stk/multi30k/stk_paper_update"],
        },
    },
}
DEFAULTS = {"tabular_steps": 2000, "vision_steps": 24, "translation_steps": 16}
QUICK = {"tabular_steps": 20, "vision_steps": 1, "translation_steps": 1}  # --quick, with one warm-up step per loss
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)  # of the paired ratios, stored in the JSON


def run_overrides(workload: str, loss: str, steps: int, data_dir: str | None, translation_overrides=()) -> list[str]:
    """Hydra overrides of one loss's run in :func:`worker`: the workload's settings, the loss, full
    batches on the CPU (the schedule and the λ monitor planned over ``steps`` epochs), no checkpoints,
    no logger."""
    spec = WORKLOADS[workload]
    overrides = [
        *spec["loss_overrides"][loss],
        *spec["overrides"],
        f"engine.batch_size={spec['batch_size']}",
        "engine.drop_last=true",
        f"engine.max_steps={steps}",
        f"engine.epochs={steps}",
        "engine.device=cpu",
        "engine.checkpoint=false",
        "engine.resume=false",
        "engine.progress=false",
        "logger=none",
    ]
    if workload == "translation":
        overrides += list(translation_overrides)
    return overrides + ([f"paths.data_dir={data_dir}"] if data_dir else [])


def pair_order(pairs: int) -> list[tuple[int, str, str]]:
    """``(pair, paired loss, loss stepped)`` in the order the timed steps run: in each round every loss
    but Average next to one of Average's steps, the losses' order rotating by one a round; Average goes
    first at the round's even positions, odd ones after a full rotation, so over every 2 × (losses − 1)
    rounds each loss takes each position once with Average first and once with Average second.

    Examples
    --------
    >>> [(r, stepped) for r, _, stepped in pair_order(2)][:4], pair_order(2)[8]
    ([(0, 'average'), (0, 'atk'), (0, 'stk'), (0, 'average')], (1, 'stk', 'average'))
    """
    others = [loss for loss in LOSSES if loss != "average"]
    order = []
    for r in range(pairs):
        shift = r % len(others)
        for position, loss in enumerate(others[shift:] + others[:shift]):
            first = (position + r // len(others)) % 2 == 0
            order += [(r, loss, stepped) for stepped in (("average", loss) if first else (loss, "average"))]
    return order


def batch_stream(run):
    """``(x, y, epoch)`` of ``run``'s training batches, epoch after epoch."""
    epoch = 0
    while True:
        for x, y in run.train_loader.batches(epoch, start=0):
            yield x, y, epoch
        epoch += 1


def worker(
    workload: str, steps: int, warmup_steps: int, threads: int, data_dir: str | None, translation_overrides=()
) -> dict:
    """Every loss of ``workload`` in this process: ``warmup_steps`` untimed steps each, then the timed
    steps of :func:`pair_order` (``steps`` pairs per loss), both steps of a pair on the same batch
    (translation batches differ in their sentences' lengths). Returns each timed step's seconds
    (``{"loss", "pair", "paired_with", "seconds"}``) and each loss's share of its steps' compute."""
    import time

    import torch
    from hydra import initialize_config_dir

    import topklab  # noqa: F401  (torchvision shim before the vision data imports torchvision)
    from topklab.config import compose_run
    from topklab.engine.build import build
    from topklab.engine.distributed import Distributed
    from topklab.engine.loop import TrainingRun
    from topklab.engine.objective import TrainingModule
    from topklab.engine.run import build_run

    torch.set_num_threads(threads)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        configs = {
            loss: compose_run(run_overrides(workload, loss, steps, data_dir, translation_overrides)) for loss in LOSSES
        }
    runs, batches = {}, {}
    for loss, cfg in configs.items():
        data, model, objective, task, engine = build_run(cfg)
        module = TrainingModule(model, objective)
        optimizer = build(cfg.optim, "optim")(module.parameter_groups())
        run = TrainingRun(engine, module, optimizer, data, task, cfg.seed, Distributed(), (None, None, None))
        run.open(None, None, None)
        run.start(None)
        runs[loss], batches[loss] = run, batch_stream(run)

    def step(loss: str, batch: tuple) -> float:
        start = time.perf_counter()
        runs[loss].train_step(*batch, 0.0)
        return time.perf_counter() - start

    for loss in LOSSES:
        for _ in range(warmup_steps):
            step(loss, next(batches[loss]))
        runs[loss].profile.reset()
    timed, order = [], pair_order(steps)
    for pair in zip(order[::2], order[1::2]):
        batch = next(batches[pair[0][1]])  # both steps of a pair on the paired loss's next batch
        timed += [
            {"loss": stepped, "pair": r, "paired_with": paired, "seconds": step(stepped, batch)}
            for r, paired, stepped in pair
        ]
    return {
        "workload": workload,
        "steps": timed,
        "loss_share": {loss: run.profile.summary()["loss_share"] for loss, run in runs.items()},
    }


def summarise(results: list[dict]) -> dict:
    """Per (workload, loss): the median step time over its timed steps, its step time against the
    Average step beside it (the median over the pairs of the ratio − 1, and the quantiles
    :data:`QUANTILES` of those ratios), the loss share, and what the loss shares imply,
    (1 − share(Average)) / (1 − share(loss)) − 1: the step time the loss's forward adds if the rest
    of the step stays the same (it leaves out the loss's backward; MATk/STk compute their loss
    gradients in the forward, so for them it holds part of the backward too)."""
    table = {}
    for result in results:
        workload, shares = result["workload"], result["loss_share"]
        of = {loss: [s for s in result["steps"] if s["loss"] == loss] for loss in LOSSES}
        table[workload] = {
            "label": WORKLOADS[workload]["label"],
            "batch_size": WORKLOADS[workload]["batch_size"],
            "pairs": len(of["atk"]),
            "losses": {},
        }
        for loss in LOSSES:
            if loss == "average":
                paired = [0.0]
            else:
                beside = {s["pair"]: s["seconds"] for s in of["average"] if s["paired_with"] == loss}
                paired = [s["seconds"] / beside[s["pair"]] - 1 for s in of[loss]]
            quantiles = {str(q): float(v) for q, v in zip(QUANTILES, np.quantile(paired, QUANTILES))}
            table[workload]["losses"][loss] = {
                "step_time_s": statistics.median(s["seconds"] for s in of[loss]),
                "steps": len(of[loss]),
                "loss_share": shares[loss],
                "added_vs_average": quantiles["0.5"],  # the median (numpy's linear quantile at 0.5 is it)
                "added_vs_average_quantiles": quantiles,
                "forward_added_from_shares": (1 - shares["average"]) / (1 - shares[loss]) - 1,
            }
    return table


def worst_stk(table: dict, loss: str = "stk") -> dict:
    """The workload where STk (row ``loss``) adds the most to a step, that fraction, and the verdict."""
    workload = max(table, key=lambda w: table[w]["losses"][loss]["added_vs_average"])
    overhead = table[workload]["losses"][loss]["added_vs_average"]
    return {"workload": workload, "added_vs_average": overhead, "meets_target": overhead <= TARGET}


def percent(value: float) -> str:
    return f"{value * 100:+.1f} %"


def render(result: dict) -> str:
    """The step-time table of a stored result."""
    table = result["result"]["workloads"]
    machine = machine_label("cpu", None, result["provenance"]["hardware"])
    lines = [
        f"# Aggregate loss inside a training step (cpu: {machine}, {result['config']['threads']} torch thread(s))",
        "",
        f"Produced by `{result['command']}`: each workload in one process, the engine's training step timed alone "
        "after warm-up steps, each loss's step next to one of Average's on the same batch (who goes first balanced).",
        "",
        "| workload | batch | pairs per loss | loss | step time (ms) | loss share | added vs Average "
        "| middle half of the pairs | forward added, from the shares |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in (table[w] for w in WORKLOADS if w in table):
        for loss, cell in ((loss, spec["losses"][loss]) for loss in LOSSES if loss in spec["losses"]):
            quantiles = cell["added_vs_average_quantiles"]
            added = (
                ["baseline", "–", "–"]
                if loss == "average"
                else [
                    percent(cell["added_vs_average"]),
                    f"{percent(quantiles['0.25'])} … {percent(quantiles['0.75'])}",
                    percent(cell["forward_added_from_shares"]),
                ]
            )
            lines.append(
                f"| {spec['label']} | {spec['batch_size']} | {spec['pairs']} | {LOSSES[loss]} | "
                f"{cell['step_time_s'] * 1e3:.3f} | {cell['loss_share'] * 100:.2f} % | {' | '.join(added)} |"
            )
    lines += [
        "",
        "Step time: the median over the loss's timed steps (Average: over all its steps). Added vs Average: "
        "the median over the pairs of the loss's step time over that of Average's step beside it − 1 "
        "(forward, backward and optimizer step); the middle half of the pairs: their 25th and 75th "
        "percentiles. Loss share: time in the objective's forward (individual loss, aggregate, penalty) "
        "over the step's compute time; the loss's backward is inside the step time but not in the share. "
        "Forward added, from the shares: (1 − share(Average)) / (1 − share(loss)) − 1, what the loss's "
        "forward alone adds if the rest of the step is the same; it leaves out the loss's backward "
        "(STk's fused kernel computes its loss gradients in the forward, so this column charges STk part "
        "of a backward that Average's column leaves out).",
        "",
    ]
    return "\n".join(lines)


def verdict(table: dict) -> str:
    parts = []
    for loss, how in zip(STK_ROWS, ("configs' kernel", "kernel=native", "paper's gradient update")):
        worst = worst_stk(table, loss)
        met = "meets" if worst["meets_target"] else "misses"
        parts.append(
            f"{worst['added_vs_average'] * 100:.1f} % with the {how} ({worst['workload']}; {met} the "
            f"≤ {TARGET * 100:.0f} % target)"
        )
    return "worst STk step overhead vs Average: " + "; ".join(parts)


def arguments(parser) -> None:
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    for workload in WORKLOADS:
        default = DEFAULTS[f"{workload}_steps"]
        parser.add_argument(f"--{workload}-steps", type=int, help=f"timed pairs per loss (default {default})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short smoke run (tests, CI): "
        f"{QUICK['tabular_steps']} tabular, {QUICK['vision_steps']} vision and "
        f"{QUICK['translation_steps']} translation pairs per loss, one warm-up step",
    )
    parser.add_argument("--data-dir", help="paths.data_dir for the runs (default: the config's .data)")
    parser.add_argument(
        "--translation-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override for the translation runs (repeatable), e.g. dataset.root=DIR",
    )
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))


def check(args) -> None:
    """Fill the step counts left unset (``--quick``'s or the defaults) and refuse what cannot run."""
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else default)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        fail(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    for name in (*DEFAULTS, "threads"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def run_worker(args: argparse.Namespace, workload: str) -> dict:
    """One workload's timed steps in a fresh process, or the benchmark's exit with its error."""
    try:
        return run_isolated(
            "benchmarks.step_share:worker",
            workload,
            getattr(args, f"{workload}_steps"),
            1 if args.quick else WORKLOADS[workload]["warmup_steps"],
            args.threads,
            args.data_dir,
            list(args.translation_override),
        )
    except WorkerFailed as err:
        fail(f"{workload} failed: {err}", code=err.returncode)


def measure(args) -> Measured:
    check(args)
    results = []
    for workload in args.workloads:
        results.append(run_worker(args, workload))
        print(f"{workload}: {len(results[-1]['steps'])} timed steps", flush=True)

    table = summarise(results)
    settings = {
        "workloads": args.workloads,
        "tabular_steps": args.tabular_steps,
        "vision_steps": args.vision_steps,
        "translation_steps": args.translation_steps,
        "threads": args.threads,
        "quick": args.quick,
        "device": "cpu",
    }
    payload = {
        "workloads": table,
        "target": TARGET,
        "worst_stk": worst_stk(table),
        "worst_stk_native": worst_stk(table, "stk_native"),
        "worst_stk_gradient": worst_stk(table, "stk_gradient"),
    }
    return Measured("step_share_cpu", payload, settings, Path(args.out_dir), summary=verdict(table))
