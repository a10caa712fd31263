"""The aggregate loss's share of a real training step: Average, ATk and STk (as the configs run it,
with ``loss.kernel=native``, and with the paper's update of λ) inside the engine.

    python scripts/bench_step_share.py [--tabular-steps 2000] [--vision-steps 24] [--translation-steps 16]
                                       [--threads 1] [--workloads tabular vision translation]
                                       [--quick] [--data-dir .data] [--translation-override KEY=VALUE ...]
                                       [--out-dir results/bench]

The benchmark is :mod:`topklab.bench.step_share` (its docstring says what is measured and written).
"""

import os
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.step_share import main  # noqa: E402

if __name__ == "__main__":
    main()
