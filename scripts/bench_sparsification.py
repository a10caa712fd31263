"""How long each gradient-sparsification selector takes to pick k of P entries, side by side.

    python scripts/bench_sparsification.py [--sizes 100000 1000000 10000000 100000000] [--ratios 0.01 0.001]
                                           [--repeats 5] [--device cpu|cuda] [--out results/bench/sparsification_cpu.json]

The benchmark is :mod:`topklab.bench.sparsification` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.sparsification import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
