"""Wall time of a training step of the routing rows' language model, dense against routed, side by side.

    python scripts/bench_routing.py [--capacities 0.125 0.25 0.5] [--repeats 10] [--device cpu|cuda]
                                    [--out results/bench/routing_cpu.json]

The benchmark is :mod:`topklab.bench.routing` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.routing import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
