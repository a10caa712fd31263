"""Epoch time of the CIFAR-100-LT ResNet-32 rows (stk/cifar100lt/*) with each data path, measured side by
side in one run, and the 200-epoch recipe's time projected from it.

    python scripts/bench_cifar_epoch.py --device cuda [--epochs 3] [--workers 8] [--out-dir results/bench]

The benchmark is :mod:`topklab.bench.cifar_epoch` (its docstring says what is measured and written).
"""

import os
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.cifar_epoch import main  # noqa: E402

if __name__ == "__main__":
    main()
