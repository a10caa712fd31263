"""Cost of PEL/LIFT's parameter-efficient ViT per branch type, measured, and the GPU-hours of the
vision tables estimated from it.

    python -m benchmarks peft [--device cpu|cuda] [--batch 4] [--steps 3] [--amp none|fp16|bf16]
                          [--channels-last] [--tuners adaptformer lora ...] [--backbone NAME]
                          [--img-size 224] [--classes 100] [--out-dir results/bench] [--tag NAME]

For each branch (``configs/tuner/<name>.yaml``) a ViT-B/16 with random weights (``pretrained=false``)
and a cosine head is built in its own process and trained for ``--steps`` SGD steps on random images
with PEL's objective (logit-adjusted CE, STk at k = 0.9 × batch, δ = 0.01) after one warm-up step;
then ``--steps`` evaluation batches. Printed per branch: trainable parameters, training and evaluation
images/s, peak memory (CUDA: ``max_memory_allocated``; CPU: the process's peak resident size, which
includes the Python runtime), the objective's share of the step (its forward, timed inside the
step), and the forward+backward FLOPs per image counted by ``torch.utils.flop_counter``.

The GPU-hours per table are an **estimate**: images each row's runs process (train + evaluation, from
the dataset sizes and the rows' recipes) × FLOPs per image ÷ a sustained rate, which is the measured
one on CUDA, else ``--assumed-tflops`` (default 100: about a third of an A100's fp16 peak).
The branches are ``configs/tuner/``'s, the default backbone is the architecture of
``configs/model/peft_vit_in21k_b16.yaml``, and the tables' recipes (tuner, epochs or steps × batch,
rows per dataset, test-time crops) are read from ``configs/experiment/stk/table{5,7,8}/``; the
datasets' image counts are not in the configs and are kept here.
Writes ``peft_<tag>.{json,md}`` (tag: the device, or ``--tag``); the JSON is a result envelope with the
command, the arguments and the provenance (git SHA and dirty flag, packages, hardware).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from functools import cache
from pathlib import Path

from benchmarks.harness import bench_device
from benchmarks.harness.isolation import WorkerFailed, project_root, run_isolated
from benchmarks.harness.memory import cuda_peak_bytes, max_rss_bytes, reset_cuda_peak
from benchmarks.harness.output import Measured
from benchmarks.harness.timing import timed
from topklab.utils.errors import TopklabError

ROOT = project_root()
CONFIGS = ROOT / "configs"
TUNER_ORDER = ("adaptformer", "lora", "vpt_deep", "vpt_shallow", "bias_only", "linear_probe", "full")  # display order
# (train images, val images, test images) per dataset of the rows (the dataset configs say them only in comments)
IMAGES = {
    "cifar100lt": (10_837, 1_000, 10_000),
    "imagenet_lt": (115_846, 20_000, 50_000),
    "places_lt": (62_500, 7_300, 36_500),
}
CROPS = {"none": 1, "fivecrop": 5, "tencrop": 10}  # evaluation crops per image of each dataset.tte


def _load(path: Path):
    from omegaconf import OmegaConf

    return OmegaConf.load(path)


def _choice(cfg, group: str) -> str:
    """The option an experiment file's defaults list picks for ``group`` (``- override /tuner: full``)."""
    for entry in cfg.get("defaults", []):
        if not isinstance(entry, str):
            for key, value in entry.items():
                if key.split()[-1].strip("/") == group:
                    return value
    raise KeyError(f"no {group} in the defaults of the experiment")


def tuner_names() -> list[str]:
    """The branches of ``configs/tuner/``, in :data:`TUNER_ORDER` (others after, by name)."""
    names = [path.stem for path in (CONFIGS / "tuner").glob("*.yaml")]
    return sorted(names, key=lambda name: (TUNER_ORDER.index(name) if name in TUNER_ORDER else len(TUNER_ORDER), name))


def default_backbone() -> str:
    """The timm architecture of the PEL rows' "IN21K" ViT-B/16 (its pretrained tag dropped: random weights here)."""
    return str(_load(CONFIGS / "model" / "peft_vit_in21k_b16.yaml").backbone).split(".")[0]


@cache
def datasets() -> dict[str, tuple[int, int, int, int]]:
    """(train, val, test images, evaluation crops per image) per dataset; crops from Table 5's column files."""
    table5 = CONFIGS / "experiment" / "stk" / "table5"
    return {name: (*images, CROPS[str(_load(table5 / f"_{name}.yaml").dataset.tte)]) for name, images in IMAGES.items()}


@cache
def tables() -> dict[str, list[tuple]]:
    """table: [(dataset, runs per seed, tuner, epochs or None, steps × batch or None)] from the rows' configs."""
    stk = CONFIGS / "experiment" / "stk"
    pel, mae = _load(stk / "table5" / "_pel.yaml"), _load(stk / "table7" / "_mae.yaml")

    def rows(table: str, dataset: str, pattern: str = "*") -> int:
        return len(list((stk / table).glob(f"{dataset}_{pattern}.yaml")))

    vision = {
        f"Table {n} (vision columns)": [
            (d, rows(f"table{n}", d), _choice(pel, "tuner"), int(pel.engine.epochs), None) for d in datasets()
        ]
        for n in (5, 8)
    }
    mae_rows = [
        (
            d,
            rows("table7", d, "mae*"),
            _choice(mae, "tuner"),
            None,
            int(mae.engine.max_steps) * int(mae.engine.batch_size),
        )
        for d in datasets()
        if rows("table7", d, "mae*")
    ]
    return {**vision, "Table 7 (MAE rows)": mae_rows}


TUNERS = tuple(tuner_names())
DATASETS = datasets()
TABLES = tables()


OBJECTIVES = {"stk": "LA + STk (k = 0.9 × batch, δ = 0.01)", "average": "LA + Average"}


def measure_branch(args) -> dict:
    """One branch's numbers (runs in its own process)."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from torch.utils.flop_counter import FlopCounterMode

    import topklab  # noqa: F401
    from topklab.losses import Average, LogitAdjusted, STk
    from topklab.models.peft import PeftViT

    torch.manual_seed(0)
    device = torch.device(args.device)
    tuner = instantiate(OmegaConf.load(CONFIGS / "tuner" / f"{args.tuner}.yaml"))
    model = PeftViT(args.classes, backbone=args.backbone, pretrained=False, tuner=tuner, img_size=args.img_size).to(
        device
    )
    individual = LogitAdjusted([max(1, int(500 * 0.01 ** (c / (args.classes - 1)))) for c in range(args.classes)]).to(
        device
    )
    aggregate = (STk(k=0.9, delta=0.01) if args.objective == "stk" else Average()).to(device)
    params = [p for group in model.parameter_groups() for p in group["params"]] + list(aggregate.parameters())
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    dtype = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.amp]
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    x = torch.randn(args.batch, 3, args.img_size, args.img_size, device=device).contiguous(memory_format=memory_format)
    y = torch.randint(0, args.classes, (args.batch,), device=device)

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def train_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = model(x)
        loss_time, objective = timed(lambda: aggregate(individual(logits.float(), y)), device)
        scaler.scale(objective).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss_time

    def train_steps() -> float:
        return sum(train_step() for _ in range(args.steps))

    train_step()
    if device.type == "cuda":
        reset_cuda_peak(device)
    train_time, loss_time = timed(train_steps, device)
    model.eval()
    with torch.no_grad(), autocast():
        model(x)
        eval_time, _ = timed(lambda: [model(x) for _ in range(args.steps)], device)
    model.train()
    one = x[:1]
    with FlopCounterMode(display=False) as counter:
        aggregate(individual(model(one).float(), y[:1])).backward()
    train_flops = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(one)
    eval_flops = counter.get_total_flops()
    peak = cuda_peak_bytes(device) if device.type == "cuda" else max_rss_bytes()
    return {
        "tuner": args.tuner,
        "trainable": model.trainable_parameters,
        "total": sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in aggregate.parameters()),
        "train_images_per_s": args.batch * args.steps / train_time,
        "eval_images_per_s": args.batch * args.steps / eval_time,
        "peak_memory_mb": peak / 2**20,
        "loss_share": loss_time / train_time,
        "train_gflops_per_image": train_flops / 1e9,
        "eval_gflops_per_image": eval_flops / 1e9,
    }


def measure_branch_options(options: dict) -> dict:
    """:func:`measure` with the command line's options as a dict (the isolated worker's entry)."""
    return measure_branch(argparse.Namespace(**options))


def table_hours(rows: dict, sustained_tflops: dict) -> list[dict]:
    """GPU-hours per table and seed from the branches' FLOPs per image and a sustained rate."""
    estimates = []
    for table, runs in tables().items():
        hours = 0.0
        for dataset, count, tuner, epochs, images in runs:
            if tuner not in rows:
                continue
            train_n, val_n, test_n, crops = datasets()[dataset]
            trained = images if images is not None else epochs * train_n
            evaluations = (
                epochs or 30
            ) * val_n * crops + test_n * crops  # Table 7: ~30 validations (one per 1,000 steps)
            flops = (
                trained * rows[tuner]["train_gflops_per_image"] * 1e9
                + evaluations * rows[tuner]["eval_gflops_per_image"] * 1e9
            )
            hours += count * flops / (sustained_tflops[tuner] * 1e12) / 3600
        estimates.append({"table": table, "gpu_hours_per_seed": hours})
    return estimates


def arguments(parser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--amp", default="none", choices=("none", "fp16", "bf16"))
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--tuners", nargs="+", default=list(TUNERS), choices=TUNERS)
    parser.add_argument("--backbone", default=default_backbone())
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--assumed-tflops", type=float, default=100.0)
    parser.add_argument(
        "--objective",
        default="stk",
        choices=OBJECTIVES,
        help="the aggregate after LA: STk (k = 0.9 × batch) or Average",
    )
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--tag", default=None)


def measure(args) -> Measured | int:
    if args.batch < 2 or args.steps < 1:
        raise TopklabError("--batch must be >= 2 (STk's k = 0.9 × batch) and --steps >= 1")
    bench_device(args.device)
    rows = {}
    for tuner in args.tuners:
        try:  # each branch in its own process
            rows[tuner] = run_isolated("benchmarks.peft:measure_branch_options", {**vars(args), "tuner": tuner})
        except WorkerFailed as err:
            print(f"error: branch {tuner} failed: {err}", file=sys.stderr)
            return 1
        r = rows[tuner]
        print(
            f"{tuner:13s} trainable {r['trainable']:>11,}  train {r['train_images_per_s']:8.2f} img/s  "
            f"eval {r['eval_images_per_s']:8.2f} img/s  peak {r['peak_memory_mb']:8.0f} MB  loss share {r['loss_share']:.2%}  "
            f"{r['train_gflops_per_image']:.1f} GFLOP/img (train)"
        )
    measured = args.device.startswith("cuda")
    sustained = {
        t: (r["train_images_per_s"] * r["train_gflops_per_image"] / 1e3 if measured else args.assumed_tflops)
        for t, r in rows.items()
    }
    estimates = table_hours(rows, sustained) if args.img_size == 224 else []
    import torch

    device_name = torch.cuda.get_device_name(0) if measured else f"{platform.machine()} CPU, {os.cpu_count()} cores"
    out = {
        "device": device_name,
        "batch": args.batch,
        "steps": args.steps,
        "amp": args.amp,
        "channels_last": args.channels_last,
        "objective": args.objective,
        "backbone": args.backbone,
        "img_size": args.img_size,
        "classes": args.classes,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": list(rows.values()),
        "sustained_tflops": sustained,
        "estimates": estimates,
        "estimate_basis": "measured training throughput"
        if measured
        else f"assumed {args.assumed_tflops:g} TFLOP/s sustained",
    }
    return Measured(
        f"peft_{args.tag or ('cuda' if measured else 'cpu')}",
        out,
        {k: v for k, v in vars(args).items() if k not in ("out_dir", "tuner", "command")},  # no machine paths
        Path(args.out_dir),
    )


def render(result: dict) -> str:
    """The per-branch cost table and the GPU-hour estimates of a stored result."""
    out = result["result"]
    lines = [
        f"# PEFT ViT cost per branch ({out['device']}, {out['threads']} torch threads)",
        "",
        f"Produced by `{result['command']}`: {out['backbone']} at {out['img_size']} px with random weights, "
        f"{out['classes']} classes, batch {out['batch']}, {out['steps']} timed steps after a warm-up, amp {out['amp']}, "
        f"channels-last {out['channels_last']}; objective: {OBJECTIVES[out.get('objective', 'stk')]}; torch {out['torch']}.",
        "",
        "| branch | trainable params | total params | train img/s | eval img/s | peak memory (MB) | loss share | "
        "train GFLOP / img | eval GFLOP / img |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['tuner']} | {r['trainable']:,} | {r['total']:,} | {r['train_images_per_s']:.2f} | "
            f"{r['eval_images_per_s']:.2f} | {r['peak_memory_mb']:.0f} | {r['loss_share']:.2%} | "
            f"{r['train_gflops_per_image']:.1f} | {r['eval_gflops_per_image']:.1f} |"
        )
    lines += [
        "",
        "Loss share: the objective's forward over the training step, timed inside the step. Peak memory on a CPU "
        "is the process's peak resident size (Python, torch and the model included).",
    ]
    if out["estimates"]:
        lines += [
            "",
            f"## GPU-hours per table and seed: an **estimate** ({out['estimate_basis']})",
            "",
            "FLOPs of the images each table's runs process (training, validation each epoch, test; 5 crops on "
            "ImageNet-LT / Places-LT) over the sustained rate; data loading and start-up are not counted.",
            "",
            "| table | GPU-hours per seed |",
            "|---|---|",
        ]
        lines += [f"| {e['table']} | {e['gpu_hours_per_seed']:.1f} |" for e in out["estimates"]]
    return "\n".join(lines) + "\n"
