"""Images per second of the two vision data paths on CIFAR-sized data, measured side by side; with
``--vit``, of the ViT-resolution pipeline (decoding and resizing to 224) instead.

    python -m benchmarks loader [--device cpu|cuda] [--images 50000] [--workers 0 2] [--out-dir results/bench]
    python -m benchmarks loader --vit [--images 1024] [--workers 0 2]

Both paths deliver the same thing to the training step: a shuffled, augmented (zero-padded random
crop 32 / 4, horizontal flip), normalised float batch of 128 on ``--device``. ``device`` is
topklab's fast path (the uint8 set held on the device, augmented there per batch);
``torchvision`` is a DataLoader with per-image ``transforms.v2`` for each ``--workers`` count.
The images are random uint8 of CIFAR's shape (the timing does not depend on the pixels; no CIFAR
is needed). Each path runs one warm-up epoch, then ``--epochs`` timed epochs (CUDA: synchronised
at the end of each). Writes ``loader_<device>.{json,md}``; the last line is
``ratio device/torchvision: N`` against the fastest torchvision setting.

``--vit`` times what the PEL rows' loaders do per image, for each ``--workers`` count: JPEG files of
Places365's small size (256 × 256, written to a temporary folder in the OLTR layout) decoded and put
through RandomResizedCrop(224) + flip (training) or Resize(256) + CenterCrop(224) (evaluation), and
CIFAR-sized in-memory images through the same training pipeline (``dataset=cifar100lt_224``). Writes
``loader_vit_<device>.{json,md}``; the last line is the speed-up of the most workers over none.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.harness import bench_device, project_root
from benchmarks.harness.output import Measured, device_tag
from topklab.report.outputs import machine_label
from topklab.utils.errors import TopklabError

ROOT = project_root()


def images_per_second(loader, epochs: int, device) -> float:
    import torch

    for _ in loader.batches(epoch=0):
        pass
    start = time.perf_counter()
    count = 0
    for epoch in range(1, epochs + 1):
        for x, _ in loader.batches(epoch=epoch):
            count += len(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return count / (time.perf_counter() - start)


def device_of(result: dict) -> str:
    """The device a stored result's images were delivered on: its file name's tag."""
    return "cuda" if result["experiment"].endswith("_cuda") else "cpu"


def where(result: dict) -> str:
    """The machine of a stored result, for its table's title."""
    device = device_of(result)
    threads = None if device == "cuda" else result["provenance"]["hardware"]["torch_threads"]
    return machine_label(device, threads, result["provenance"]["hardware"])


def settings(args) -> dict:
    return {"images": args.images, "batch_size": args.batch_size, "epochs": args.epochs}


def arguments(parser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--vit", action="store_true", help="time the ViT-resolution pipeline instead")


def measure(args) -> Measured:
    if args.vit:
        return vit_pipeline(args)

    import torch

    import topklab  # noqa: F401  (torchvision shim)
    from topklab.data.vision import DeviceLoader, TorchvisionLoader

    device = bench_device(args.device)
    if args.images < args.batch_size or args.epochs < 1 or any(w < 0 for w in args.workers):
        raise TopklabError("need --images >= --batch-size, --epochs >= 1 and --workers >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    images = torch.randint(
        0, 256, (args.images, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    labels = torch.randint(0, 100, (args.images,), generator=torch.Generator().manual_seed(1))
    mean, std = [0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762]
    common = dict(train=True, device=device, pad=4, flip=True, channels_last=device.type == "cuda", seed=0)
    rows = [
        {
            "path": "device",
            "workers": None,
            "images_per_s": images_per_second(
                DeviceLoader(images, labels, args.batch_size, mean, std, **common), args.epochs, device
            ),
        }
    ]
    print(f"device loader: {rows[0]['images_per_s']:,.0f} images/s", flush=True)
    for workers in args.workers:
        loader = TorchvisionLoader(images, labels, args.batch_size, mean, std, num_workers=workers, **common)
        rows.append(
            {"path": "torchvision", "workers": workers, "images_per_s": images_per_second(loader, args.epochs, device)}
        )
        print(f"torchvision loader, {workers} workers: {rows[-1]['images_per_s']:,.0f} images/s", flush=True)
    best = max(r["images_per_s"] for r in rows[1:])
    ratio = rows[0]["images_per_s"] / best
    return Measured(
        f"loader_{device_tag(device)}",
        {"results": rows, "ratio": ratio},
        settings(args),
        Path(args.out_dir),
        summary=f"ratio device/torchvision: {ratio:.2f}",
    )


def render(result: dict) -> str:
    """The images/s table of a stored result (either mode)."""
    return (render_vit if result["experiment"].startswith("loader_vit") else render_paths)(result)


def render_paths(result: dict) -> str:
    rows, config, device = result["result"]["results"], result["config"], device_of(result)
    lines = [
        f"# Vision data paths: images/s ({device}: {where(result)})",
        "",
        f"Produced by: `{result['command']}`.  ",
        f"{config['images']:,} CIFAR-sized uint8 images, batch {config['batch_size']}, random crop 32/4 + flip + "
        f"normalise, delivered on `{device}`; {config['epochs']} timed epoch(s) after one warm-up epoch.",
        "",
        "| path | workers | images/s |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['path']} | {'-' if r['workers'] is None else r['workers']} | {r['images_per_s']:,.0f} |" for r in rows
    ]
    lines += ["", f"Ratio device / fastest torchvision: **{result['result']['ratio']:.1f}×**", ""]
    return "\n".join(lines)


def vit_pipeline(args) -> Measured:
    import tempfile

    import numpy as np
    import torch
    from PIL import Image

    import topklab  # noqa: F401  (torchvision shim)
    from topklab.data.vision.listed import ArrayImages, ImageFiles, SeededImageLoader, image_transforms

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.images < args.batch_size or any(w < 0 for w in args.workers):
        raise TopklabError("need --images >= --batch-size and --workers >= 0")
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 365, args.images)
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    train, evaluate = image_transforms(True, 224, mean, std), image_transforms(False, 224, mean, std)
    cifar = torch.from_numpy(rng.integers(0, 256, (args.images, 3, 32, 32), dtype=np.uint8))
    rows = []
    with tempfile.TemporaryDirectory() as root:
        paths = []
        for i in range(args.images):
            relative = f"train/scene_{labels[i] % 20}/{i:06d}.jpg"
            (Path(root) / relative).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(Path(root) / relative, quality=90)
            paths.append(relative)
        sources = [
            ("JPEG 256×256, training crop", lambda: ImageFiles(Path(root), paths, labels, train, None), True),
            ("JPEG 256×256, evaluation crop", lambda: ImageFiles(Path(root), paths, labels, evaluate, None), False),
            ("CIFAR 32×32 in memory, training crop", lambda: ArrayImages(cifar, labels, train, None), True),
        ]
        for name, make, is_train in sources:
            for workers in args.workers:
                loader = SeededImageLoader(
                    make(), args.batch_size, is_train, seed=0, num_workers=workers, device=device
                )
                rows.append(
                    {"source": name, "workers": workers, "images_per_s": images_per_second(loader, args.epochs, device)}
                )
                print(f"{name}, {workers} workers: {rows[-1]['images_per_s']:,.0f} images/s", flush=True)
    most, fewest = max(args.workers), min(args.workers)
    speedup = {
        name: next(r["images_per_s"] for r in rows if r["source"] == name and r["workers"] == most)
        / next(r["images_per_s"] for r in rows if r["source"] == name and r["workers"] == fewest)
        for name, _, _ in sources
    }
    return Measured(
        f"loader_vit_{device_tag(device)}",
        {"results": rows, "speedup": speedup},
        settings(args),
        Path(args.out_dir),
        summary=f"speed-up {most} workers / {fewest}: " + ", ".join(f"{v:.2f}" for v in speedup.values()),
    )


def render_vit(result: dict) -> str:
    rows, config, speedup = result["result"]["results"], result["config"], result["result"]["speedup"]
    most, fewest, device = max(r["workers"] for r in rows), min(r["workers"] for r in rows), device_of(result)
    lines = [
        f"# ViT-resolution data pipeline: images/s ({device}: {where(result)})",
        "",
        f"Produced by: `{result['command']}`.  ",
        f"{config['images']:,} images, batch {config['batch_size']}, delivered as normalised 224 × 224 float batches "
        f"on `{device}`; {config['epochs']} timed epoch(s) after one warm-up epoch; bilinear resizes (PIL).",
        "",
        "| source | workers | images/s |",
        "|---|---|---|",
    ]
    lines += [f"| {r['source']} | {r['workers']} | {r['images_per_s']:,.0f} |" for r in rows]
    lines += [
        "",
        f"Speed-up of {most} workers over {fewest}: "
        + "; ".join(f"{name}: **{speedup[name]:.2f}×**" for name in dict.fromkeys(r["source"] for r in rows)),
        "",
    ]
    return "\n".join(lines)
