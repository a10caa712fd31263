"""What Petersen et al.'s ImageNet tables cost on this machine: embedding extraction and head training.

    python scripts/bench_embeddings.py [--device cpu|cuda] [--quick] [--out results/bench/embeddings_cpu.json]

The benchmark is :mod:`topklab.bench.embeddings` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.embeddings import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
