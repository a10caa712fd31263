"""Model-steps per second of the population executor against the per-model engine, same work.

    .venv/bin/python scripts/bench_population.py [--dataset australian] [--preset full] [--members 5280]

The benchmark is :mod:`topklab.bench.population` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.population import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
