"""Images per second of the two vision data paths on CIFAR-sized data, measured side by side; with
``--vit``, of the ViT-resolution pipeline (decoding and resizing to 224) instead.

    python scripts/bench_loader.py [--device cpu|cuda] [--images 50000] [--workers 0 2] [--out-dir results/bench]
    python scripts/bench_loader.py --vit [--images 1024] [--workers 0 2]

The benchmark is :mod:`topklab.bench.loader` (its docstring says what is measured and written).
"""

import os
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.loader import main  # noqa: E402

if __name__ == "__main__":
    main()
