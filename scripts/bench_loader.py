"""Images per second of the two vision data paths on CIFAR-sized data, measured side by side.

    python scripts/bench_loader.py [--device cpu|cuda] [--images 50000] [--workers 0 2] [--out-dir results/bench]

Both paths deliver the same thing to the training step: a shuffled, augmented (zero-padded random
crop 32 / 4, horizontal flip), normalised float batch of 128 on ``--device``. ``device`` is
topklab's fast path (the uint8 set held on the device, augmented there per batch);
``torchvision`` is a DataLoader with per-image ``transforms.v2`` for each ``--workers`` count.
The images are random uint8 of CIFAR's shape (the timing does not depend on the pixels; no CIFAR
is needed). Each path runs one warm-up epoch, then ``--epochs`` timed epochs (CUDA: synchronised
at the end of each). Writes ``loader_<device>.{json,md}``; the last line is
``ratio device/torchvision: N`` against the fastest torchvision setting.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    args = parser.parse_args()

    import torch

    import topklab  # noqa: F401  (torchvision shim)
    from topklab.data.vision import DeviceLoader, TorchvisionLoader
    from topklab.report import make_result, write_result
    from topklab.utils.io import atomic_write_text
    from topklab.utils.provenance import collect, hardware

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available here; use --device cpu", file=sys.stderr)
        raise SystemExit(2)
    if args.images < args.batch_size or args.epochs < 1 or any(w < 0 for w in args.workers):
        print("error: need --images >= --batch-size, --epochs >= 1 and --workers >= 0", file=sys.stderr)
        raise SystemExit(2)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    images = torch.randint(0, 256, (args.images, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 100, (args.images,), generator=torch.Generator().manual_seed(1))
    mean, std = [0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762]
    common = dict(train=True, device=device, pad=4, flip=True, channels_last=device.type == "cuda", seed=0)
    rows = [{"path": "device", "workers": None,
             "images_per_s": images_per_second(DeviceLoader(images, labels, args.batch_size, mean, std, **common),
                                               args.epochs, device)}]
    print(f"device loader: {rows[0]['images_per_s']:,.0f} images/s", flush=True)
    for workers in args.workers:
        loader = TorchvisionLoader(images, labels, args.batch_size, mean, std, num_workers=workers, **common)
        rows.append({"path": "torchvision", "workers": workers,
                     "images_per_s": images_per_second(loader, args.epochs, device)})
        print(f"torchvision loader, {workers} workers: {rows[-1]['images_per_s']:,.0f} images/s", flush=True)
    best = max(r["images_per_s"] for r in rows[1:])
    ratio = rows[0]["images_per_s"] / best
    machine = hardware()
    where = ", ".join(machine["gpus"]) if device.type == "cuda" else f"{machine.get('processor') or machine['machine']}, {machine['cpu_count']} cores, {torch.get_num_threads()} torch threads"
    kind = "cuda" if device.type == "cuda" else "cpu"
    command = " ".join(["python", "scripts/bench_loader.py", *sys.argv[1:]])
    out_dir = Path(args.out_dir)
    write_result(out_dir / f"loader_{kind}.json", make_result(
        "bench", f"loader_{kind}", {"results": rows, "ratio": ratio}, command=command,
        config={"images": args.images, "batch_size": args.batch_size, "epochs": args.epochs}, provenance=collect(ROOT)))
    lines = [f"# Vision data paths: images/s ({kind}: {where})", "", f"Produced by: `{command}`.  ",
             f"{args.images:,} CIFAR-sized uint8 images, batch {args.batch_size}, random crop 32/4 + flip + normalise, "
             f"delivered on `{device}`; {args.epochs} timed epoch(s) after one warm-up epoch.", "",
             "| path | workers | images/s |", "|---|---|---|"]
    lines += [f"| {r['path']} | {'-' if r['workers'] is None else r['workers']} | {r['images_per_s']:,.0f} |" for r in rows]
    lines += ["", f"Ratio device / fastest torchvision: **{ratio:.1f}×**", ""]
    atomic_write_text(out_dir / f"loader_{kind}.md", "\n".join(lines))
    print(f"wrote {out_dir}/loader_{kind}.{{json,md}}")
    print(f"ratio device/torchvision: {ratio:.2f}")


if __name__ == "__main__":
    main()
