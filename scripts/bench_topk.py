"""Forward + backward time and peak memory of the aggregate losses on n per-sample losses.

    python scripts/bench_topk.py [--quick] [--device cpu|cuda] [--max-exp 7] [--out-dir results/bench]

The benchmark is :mod:`topklab.bench.topk` (its docstring says what is measured and written).
"""

import os
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.topk import main  # noqa: E402

if __name__ == "__main__":
    main()
