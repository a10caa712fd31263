"""What Petersen et al.'s ImageNet tables cost on this machine: embedding extraction and head training.

    python -m benchmarks embeddings [--device cpu|cuda] [--quick] [--out results/bench/embeddings_cpu.json]

1. Extraction: images/s of each backbone through ``topklab.data.embeddings.extract`` (JPEG decode,
   timm's transform, forward, memory-mapped write; one process) on a generated tree of ImageNet-sized
   JPEGs (500 × 375): two small stand-ins and the paper's three backbones with random weights (the
   same arithmetic as the pretrained ones), a few images each after a one-batch warm-up extraction
   (kernel selection and caches excluded); the extrapolated hours for ImageNet-1K (1,331,167 images)
   and ImageNet-21K-P (winter 2021, about 11.58 M images).
2. Head training at the real shapes on random float16 embeddings: ImageNet-1K as a full-size memory map
   (1,281,167 × 2048 training rows), ImageNet-21K-P (10,450 classes) on 200,000 rows, each row of the
   tables' methods (uniform P_K; softmax CE; the smooth top-k SVM) through the engine: median step time at
   batch 500, the time to score 500-row validation batches, peak memory, and the epoch and run time they
   imply (steps per epoch × step + evaluations per epoch × validation pass).
The paper's backbones (timm architecture, resolution, GPU precision) come from ``configs/backbone/``;
the hold-out, epochs and m of each dataset from ``configs/dataset/*_embeddings.yaml`` and the
``experiment=petersen/<dataset>`` rows; image counts, classes and widths are not in the configs and are kept here.
Absolute times: run it on a quiet machine. Writes a result envelope and its table;
``python -m benchmarks render results/bench/embeddings_cpu.json`` draws the table again.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness.isolation import project_root
from benchmarks.harness.memory import max_rss_mb as peak_rss_mb
from benchmarks.harness.output import Measured, json_file

ROOT = project_root()
CONFIGS = ROOT / "configs"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

STAND_INS = [  # label, timm name, resolution, images, batch, precision on a GPU (fp32 on a CPU)
    ("stand-in: test_efficientnet", "test_efficientnet", 224, 32, 8, "fp32"),
    ("stand-in: resnet50", "resnet50", 224, 16, 8, "fp32"),
]
PAPER_BACKBONES = [  # label, configs/backbone/<name>.yaml, images timed, batch
    ("ResNeXt-101 32x48d WSL (1K)", "resnext101_32x48d_wsl_320", 6, 2),
    ("ResNeXt-101 32x48d WSL (21K-P)", "resnext101_32x48d_wsl_224", 6, 2),
    ("EfficientNet-L2 NS", "tf_efficientnet_l2_ns_800", 3, 1),
]
# what the configs do not hold: image counts (train, test), classes and the embeddings' width
SIZES = {
    "imagenet1k": {"train": 1_281_167, "test": 50_000, "classes": 1000, "dim": 2048},
    "imagenet21kp": {"train": 11_060_223, "test": 522_500, "classes": 10_450, "dim": 2048},
}
METHODS = [
    "softmax_ce",
    "smooth_topk_svm_top5",
    "bitonic_uniform",
    "splitter_selection_uniform",
    "neuralsort_uniform",
    "softsort_uniform",
    "sinkhorn_uniform",
]


def _load(path: Path):
    from omegaconf import OmegaConf

    return OmegaConf.load(path)


def backbones() -> list[tuple]:
    """The stand-ins, then the paper's backbones: (label, timm architecture, resolution, images, batch, GPU precision),
    the architecture, resolution and precision from ``configs/backbone/`` (random weights: the pretrained tag dropped)."""
    rows = list(STAND_INS)
    for label, config, images, batch in PAPER_BACKBONES:
        cfg = _load(CONFIGS / "backbone" / f"{config}.yaml")
        rows.append((label, str(cfg.name).split(".")[0], int(cfg.resolution), images, batch, str(cfg.precision)))
    return rows


def shape_of(dataset: str) -> dict:
    """A dataset's shape: :data:`SIZES` with the hold-out (``configs/dataset/<dataset>_embeddings.yaml``), the epochs
    (its rows' ``_common.yaml``) and m (the rows' top-m pre-selection)."""
    rows = CONFIGS / "experiment" / "petersen" / dataset
    m = next(
        (
            row.individual.m
            for row in map(_load, sorted(rows.glob("[!_]*.yaml")))
            if row.get("individual") and row.individual.get("m")
        ),
        None,
    )
    return {
        **{k: SIZES[dataset][k] for k in ("train", "test")},
        "holdout": int(_load(CONFIGS / "dataset" / f"{dataset}_embeddings.yaml").holdout),
        "classes": SIZES[dataset]["classes"],
        "m": m,
        "epochs": int(_load(rows / "_common.yaml").engine.epochs),
        "dim": SIZES[dataset]["dim"],
    }


IMAGENET_1K = shape_of("imagenet1k")
IMAGENET_21KP = shape_of("imagenet21kp")
BACKBONES = backbones()


def jpeg_tree(root: Path, images: int) -> Path:
    """``root`` holding ``images`` generated training JPEGs (and one validation image), written once."""
    import numpy as np
    from PIL import Image

    if root.exists():
        return root
    rng = np.random.RandomState(0)
    for split, count in (("train", images), ("val", 0)):
        folder = root / split / "n00000000"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            smooth = rng.randint(0, 255, (47, 63, 3), dtype=np.uint8)  # upsampled noise: JPEG sizes like photos
            Image.fromarray(smooth).resize((500, 375), Image.BICUBIC).save(folder / f"img_{i}.JPEG", quality=90)
    (root / "val" / "n00000000" / "img_0.JPEG").write_bytes((root / "train" / "n00000000" / "img_0.JPEG").read_bytes())
    return root


def bench_extraction(device, work: Path, backbones) -> list[dict]:
    import timm
    import torch

    from topklab.data.embeddings import Backbone
    from topklab.data.embeddings.extract import extract

    rows = []
    for label, name, resolution, images, batch, gpu_precision in backbones:
        tree = jpeg_tree(work / f"tree{images}", images)
        torch.manual_seed(0)
        backbone = Backbone(
            name, resolution, pretrained=False, precision=gpu_precision if device.type == "cuda" else "fp32"
        )
        warm = jpeg_tree(work / f"warm{batch}", batch)
        extract(
            backbone,
            warm,
            work / f"warm_{name}_{resolution}",
            {"train": "train", "test": "val"},
            batch_size=batch,
            shard_size=batch,
            num_workers=0,
            device=str(device),
            progress=False,
        )  # one batch: kernels chosen, caches warm
        start = time.perf_counter()
        report = extract(
            backbone,
            tree,
            work / f"out_{name}_{resolution}",
            {"train": "train", "test": "val"},
            batch_size=batch,
            shard_size=max(images, 1),
            num_workers=0,
            device=str(device),
            progress=False,
        )
        rate = report["train"]["images_per_s"]
        with torch.device("meta"):  # the architecture's size without a second copy of its weights
            params = sum(p.numel() for p in timm.create_model(name, pretrained=False, num_classes=0).parameters())
        rows.append(
            {
                "part": "extraction",
                "backbone": label,
                "name": name,
                "resolution": resolution,
                "images": images,
                "batch": batch,
                "images_per_s": rate,
                "seconds_per_image": 1 / rate,
                "parameters": params,
                "precision": backbone.precision,
                "wall_s": time.perf_counter() - start,
                "peak_rss_mb": peak_rss_mb(),
                "hours_imagenet1k": (IMAGENET_1K["train"] + IMAGENET_1K["test"]) / rate / 3600,
                "hours_imagenet21kp": (IMAGENET_21KP["train"] + IMAGENET_21KP["test"]) / rate / 3600,
            }
        )
        print(f"extraction {label} @{resolution}: {rate:.2f} images/s", flush=True)
    return rows


def random_embeddings(root: Path, shape: dict, train_rows: int, test_rows: int):
    import numpy as np
    from numpy.lib.format import open_memmap

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(f"c{c}" for c in range(shape["classes"])) + "\n")
    for split, rows in (("train", train_rows), ("test", test_rows)):
        (root / split).mkdir(exist_ok=True)
        array = open_memmap(root / split / "embeddings.npy", mode="w+", dtype="float16", shape=(rows, shape["dim"]))
        for start in range(0, rows, 100_000):
            stop = min(start + 100_000, rows)
            array[start:stop] = rng.standard_normal((stop - start, shape["dim"]), dtype=np.float32)
        array.flush()
        np.save(root / split / "labels.npy", rng.integers(0, shape["classes"], rows))
    return root


def bench_heads(device, dataset: str, shape: dict, root: Path, train_rows: int, steps: int, methods) -> list[dict]:
    """Each method's row built as train.py builds it (data, model, objective, optimizer); its training
    steps and a validation pass timed here, so the median excludes the first steps' set-up."""
    import torch
    from hydra import initialize_config_dir

    from topklab.config import compose_run
    from topklab.engine.build import build
    from topklab.engine.objective import TrainingModule
    from topklab.engine.run import build_run

    rows = []
    holdout = min(shape["holdout"], train_rows // 10)
    for method in methods:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose_run(
                [
                    f"experiment=petersen/{dataset}/{method}",
                    f"dataset.root={root}",
                    f"dataset.holdout={holdout}",
                    f"engine.device={device}",
                    "logger=none",
                    "result_file=null",
                    f"paths.log_dir={root}/logs",
                ]
            )
        data, model, objective, _, _ = build_run(cfg)
        module = TrainingModule(model, objective).to(device)
        optimizer = build(cfg.optim, "optim")(module.parameter_groups())
        times = []
        for i, (x, y) in enumerate(data.train_loader(500, True, 0, device).batches(0)):
            if i == steps + 3:
                break
            start = time.perf_counter()  # the gather from the memory map happened in the loader: timed below
            optimizer.zero_grad(set_to_none=True)
            loss, _ = module(x, y)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        loader = data.train_loader(500, True, 0, device)
        start = time.perf_counter()
        for _ in zip(range(steps), loader.batches(1)):
            pass
        gather_s = (time.perf_counter() - start) / steps
        step_s = statistics.median(times[3:]) + gather_s
        model.eval()
        with torch.no_grad():
            start = time.perf_counter()
            for x, _ in data.eval_loader("val", 500, device).batches():
                model(x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            val_rows_s = holdout / (time.perf_counter() - start)
        steps_per_epoch = (shape["train"] - shape["holdout"]) // 500
        evaluations = steps_per_epoch // 100 + 1
        validation_s = shape["holdout"] / val_rows_s
        epoch_s = steps_per_epoch * step_s + evaluations * validation_s
        rows.append(
            {
                "part": "head",
                "dataset": dataset,
                "method": method,
                "classes": shape["classes"],
                "m": cfg.individual.get("m"),
                "rows_on_disk": train_rows,
                "steps_timed": steps,
                "step_s": step_s,
                "gather_s": gather_s,
                "validation_rows_per_s": val_rows_s,
                "steps_per_epoch": steps_per_epoch,
                "evaluations_per_epoch": evaluations,
                "validation_pass_s": validation_s,
                "epoch_h": epoch_s / 3600,
                "run_h": shape["epochs"] * epoch_s / 3600,
                "epochs": shape["epochs"],
                "peak_rss_mb": peak_rss_mb(),
            }
        )
        print(f"head {dataset} {method}: {step_s * 1000:.1f} ms/step, epoch {epoch_s / 3600:.2f} h", flush=True)
    return rows


def render(result: dict) -> str:
    payload = result["result"]
    rows = payload["rows"]
    git = result["provenance"].get("git", {})
    hw = result["provenance"].get("hardware", {})
    lines = [
        f"# Cost of the ImageNet path ({payload['device']}, {payload['threads']} torch threads)",
        "",
        f"Produced by `{result['command']}` at {str(git.get('sha'))[:10]}{' (dirty tree)' if git.get('dirty') else ''} "
        f"on {hw.get('cpu', hw.get('machine', '?'))}; random weights and random float16 embeddings of the real shapes "
        f"(times do not depend on the values). Load average at the start: {payload.get('load_average')}.",
        "",
        "## Extraction (JPEG 500 × 375 → timm transform → forward → float16 memory map)",
        "",
        "| backbone | input | parameters | images timed | batch | images/s | s / image | ImageNet-1K (h) | ImageNet-21K-P (h) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["part"] == "extraction"):
        lines.append(
            f"| {r['backbone']} | {r['resolution']} px, {r['precision']} | {r['parameters'] / 1e6:.1f} M | {r['images']} | "
            f"{r['batch']} | {r['images_per_s']:.2f} | {r['seconds_per_image']:.3g} | {r['hours_imagenet1k']:,.0f} | "
            f"{r['hours_imagenet21kp']:,.0f} |"
        )
    lines += [
        "",
        "ImageNet-1K: 1,281,167 + 50,000 images; ImageNet-21K-P (winter 2021, Ridnik et al.): about 11.06 M + 0.52 M.",
        "",
        "## Linear head at the real shapes (batch 500, Adam, through the engine)",
        "",
        "Step: median training step after 3 warm-up steps (forward, loss, backward, Adam) plus the mean time to gather "
        "500 rows from the memory map (the file in the page cache). Validation: one "
        "pass over the hold-out in 500-row batches; difftopk validates every 100 steps and after each epoch's last. "
        "Epoch = steps × step + evaluations × validation pass; run = epochs × epoch (one seed, one row). Peak RSS: the "
        "process's largest resident size so far (the extraction before it included; memory-mapped pages it touched count).",
        "",
        "| dataset | method | classes | m | rows on disk | step (ms) | of which gather (ms) | validation (rows/s) "
        "| steps / epoch | epoch (h) | run (h) | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["part"] == "head"):
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['classes']:,} | {r['m'] or '—'} | {r['rows_on_disk']:,} | "
            f"{r['step_s'] * 1000:.1f} | {r['gather_s'] * 1000:.1f} | {r['validation_rows_per_s']:,.0f} | "
            f"{r['steps_per_epoch']:,} | {r['epoch_h']:.2f} | {r['run_h']:.1f} | {r['peak_rss_mb']:,.0f} |"
        )
    heads = [r for r in rows if r["part"] == "head"]
    if heads:
        per_table = {}
        for r in heads:
            per_table.setdefault(r["dataset"], []).append(r["run_h"])
        rows_of = {
            d: len([p for p in (CONFIGS / "experiment" / "petersen" / d).glob("*.yaml") if not p.name.startswith("_")])
            for d in per_table
        }
        lines += [
            "",
            "One seed of every row of a table (the rows not timed here cost about as much as the timed row of "
            "their method): "
            + "; ".join(
                f"{d} ({rows_of[d]} rows): about {statistics.median(v) * rows_of[d]:,.0f} h"
                for d, v in per_table.items()
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def arguments(parser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="stand-ins and two methods only (a test of the script)")
    parser.add_argument("--steps", type=int, default=30, help="training steps timed per method")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one; 6 GB)")
    parser.add_argument("--out", type=json_file, default=None)


def measure(args) -> Measured:
    from benchmarks.harness import bench_device, device_rows

    device = bench_device(args.device)
    recorded = args.command.split(" ")
    if "--work" in recorded:  # a scratch folder is a machine path: kept out of the recorded command
        at = recorded.index("--work")
        recorded[at : at + 2] = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        backbones = BACKBONES[:1] if args.quick else BACKBONES
        rows = bench_extraction(device, work, backbones)
        if args.quick:
            shape = {**IMAGENET_1K, "classes": 100, "dim": 64}
            root = random_embeddings(work / "emb1k", shape, 20_000, 1_000)
            rows += bench_heads(device, "imagenet1k", shape, root, 20_000, 4, METHODS[:3:2])
        else:
            root = random_embeddings(work / "emb1k", IMAGENET_1K, IMAGENET_1K["train"], IMAGENET_1K["test"])
            rows += bench_heads(device, "imagenet1k", IMAGENET_1K, root, IMAGENET_1K["train"], args.steps, METHODS)
            root = random_embeddings(work / "emb21k", IMAGENET_21KP, 200_000, 1_000)
            rows += bench_heads(
                device,
                "imagenet21kp",
                IMAGENET_21KP,
                root,
                200_000,
                max(args.steps // 3, 5),
                ["softmax_ce", "bitonic_uniform", "neuralsort_uniform"],
            )
    config = {"quick": args.quick, "steps": args.steps, "load_average": round(load, 2)}
    measured = device_rows(ROOT, "embeddings", device, rows, config, args.out)
    measured.command = " ".join(recorded)
    return measured
