"""Epoch time of the CIFAR-100-LT ResNet-32 rows (stk/cifar100lt/*) with each data path, measured side by
side in one run, and the 200-epoch recipe's time projected from it.

    python -m benchmarks cifar_epoch --device cuda [--epochs 3] [--workers 8] [--out-dir results/bench]

The files are CIFAR-100 in torchvision's on-disk format (500 training and 100 test images per class,
random class-coloured pixels; the timing does not depend on them) written by the test helper
``tests/helpers/vision_files.write_cifar100``, then cut to the row's ρ = 100 long tail (10,847 images) as a
real run would. Each path (``dataset.loader=device``: the uint8 set on the device, augmented there;
``torchvision``: a DataLoader with ``--workers`` workers) trains the la_stk row for ``--epochs`` epochs
(training and validation, from the engine's ``elapsed_s``); the first epoch (cuDNN autotuning, the C++
or Triton kernel build) is left out of the median. Writes ``cifar_epoch_<device>.{json,md}``; the last
line is ``ratio torchvision/device epoch time: N``.
"""

from __future__ import annotations

import csv
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.isolation import project_root
from benchmarks.harness.output import Measured
from topklab.utils.errors import TopklabError

ROOT = project_root()
RECIPE_EPOCHS = 200


def epoch_seconds(run_dir: Path) -> list[float]:
    with open(run_dir / "epochs.csv") as handle:
        elapsed = [float(row["elapsed_s"]) for row in csv.DictReader(handle)]
    return [b - a for a, b in zip([0.0, *elapsed], elapsed)]


def arguments(parser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers of the torchvision path")
    parser.add_argument(
        "--per-class", type=int, default=500, help="training images per class before the long-tail cut (CIFAR: 500)"
    )
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))


def measure(args) -> Measured:
    if args.epochs < 2 or args.workers < 0:
        raise TopklabError("need --epochs >= 2 (the first is left out) and --workers >= 0")

    from hydra import initialize_config_dir

    from topklab.config import compose_run
    from topklab.engine.run import train

    sys.path.insert(0, str(ROOT / "tests"))  # the CIFAR-100 file writer is the tests' helper
    try:
        from helpers.vision_files import write_cifar100
    finally:
        sys.path.remove(str(ROOT / "tests"))

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = write_cifar100(
            Path(tmp) / "cifar", per_class_train=args.per_class, per_class_test=max(args.per_class // 5, 1)
        )
        for loader, workers in (("device", 0), ("torchvision", args.workers)):
            run_dir = Path(tmp) / f"run_{loader}"
            with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
                cfg = compose_run(
                    [
                        f"paths.log_dir={tmp}",
                        "experiment=stk/cifar100lt/la_stk",
                        f"dataset.root={root}",
                        f"dataset.loader={loader}",
                        f"dataset.num_workers={workers}",
                        f"engine.epochs={args.epochs}",
                        f"engine.device={args.device}",
                        "result_file=null",
                        "engine.progress=false",
                        *(
                            []
                            if args.per_class == 500
                            else [
                                f"dataset.n_max={args.per_class}",
                                "dataset.imbalance_ratio=2",
                                "dataset.val_per_class=1",
                            ]
                        ),
                    ]
                )
            summary = train(cfg, run_dir)
            seconds = epoch_seconds(run_dir)
            steady = statistics.median(seconds[1:])
            rows.append(
                {
                    "loader": loader,
                    "workers": workers,
                    "epoch_seconds": seconds,
                    "median_epoch_s": steady,
                    "device": summary["device"],
                    "projected_recipe_hours": steady * RECIPE_EPOCHS / 3600,
                }
            )
    ratio = rows[1]["median_epoch_s"] / rows[0]["median_epoch_s"]
    return Measured(
        f"cifar_epoch_{args.device}",
        {"rows": rows, "ratio": ratio},
        {
            "device": args.device,
            "epochs": args.epochs,
            "workers": args.workers,
            "per_class": args.per_class,
            "row": "stk/cifar100lt/la_stk",
        },
        Path(args.out_dir),
        summary=f"ratio torchvision/device epoch time: {ratio:.2f}",
    )


def render(result: dict) -> str:
    """The epoch times per data path and the projected recipe time, from a stored result."""
    rows, settings, per_class = result["result"]["rows"], result["config"], result["config"]["per_class"]
    lines = [
        f"# ResNet-32 CIFAR-100-LT epoch time ({settings.get('device') or result['experiment'].rpartition('_')[2]})",
        "",
        f"`{result['command']}` on {rows[0]['device']}: row {settings['row']} (batch 128"
        f"{', ρ = 100, 10,847 training images' if per_class == 500 else f', {per_class} images per class before a ρ = 2 cut'}),"
        f" training + validation per epoch, the first epoch left out of the median;"
        f" {RECIPE_EPOCHS}-epoch time projected from the median.",
        "",
        "| loader | workers | epoch seconds | median (s) | 200 epochs (h) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['loader']} | {row['workers']} | {', '.join(f'{s:.1f}' for s in row['epoch_seconds'])} |"
            f" {row['median_epoch_s']:.2f} | {row['projected_recipe_hours']:.2f} |"
        )
    lines += ["", f"ratio torchvision/device epoch time: {result['result']['ratio']:.2f}"]
    return "\n".join(lines)
