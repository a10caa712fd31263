"""Write the STk paper's Figures 2-4 and the pictures the docs pages embed to results/figures/ from results/ only:
`python -m topklab.report figures`.

    python scripts/make_figures.py [--results results] [--out results/figures]

Figures 3 and 4 come from results/synthetic/figure{3,4}.json (topklab.report.figures), the pictures
from the results beside their tables (topklab.report.charts).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.report.cli import figures as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
