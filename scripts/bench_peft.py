"""Cost of PEL/LIFT's parameter-efficient ViT per branch type, measured, and the GPU-hours of the
vision tables estimated from it.

    python scripts/bench_peft.py [--device cpu|cuda] [--batch 4] [--steps 3] [--amp none|fp16|bf16]
                                 [--channels-last] [--tuners adaptformer lora ...] [--backbone NAME]
                                 [--img-size 224] [--classes 100] [--out-dir results/bench] [--tag NAME]

The benchmark is :mod:`topklab.bench.peft` (its docstring says what is measured and written).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.bench.peft import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
