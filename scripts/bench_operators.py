"""Every differentiable top-k operator of ``configs/operator/`` side by side: speed, memory,
exactness and quality, measured in one run.

    python scripts/bench_operators.py --quick                    # < 1 min: our odd-even network vs difftopk's dense odd-even path
    python scripts/bench_operators.py [--device cpu|cuda] [--operators NAME ...] [--sizes 5 10 ...]
                                      [--large-sizes 10000 ...] [--repeats 20] [--memory-limit-gb 4]
                                      [--peer-batch 1] [--train-epochs 10] [--no-train]
                                      [--out-dir results/bench] [--tag NAME]
    python scripts/bench_operators.py --render results/bench/operators_cpu.json   # redraw table + plot only

The benchmark is :mod:`topklab.bench.operators` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.operators import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
