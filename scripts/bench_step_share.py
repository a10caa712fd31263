"""The aggregate loss's share of a real training step: Average, ATk and STk (its default kernel, and
``loss.kernel=native``) inside the engine.

    python scripts/bench_step_share.py [--tabular-steps 2000] [--vision-steps 18] [--translation-steps 20]
                                       [--repeats 3] [--threads 1] [--workloads tabular vision translation]
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
