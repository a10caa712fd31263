"""Write results/tables/ from results/ only (never trains): `python -m topklab.report tables`.

    python scripts/make_tables.py [--preset quick] [--results results] [--out results/tables]

Tables 3, 4, 6 (.md, .tex) from results/tabular/<preset>/, Table 1 from results/bench/table1.json,
Table 2 from results/synthetic/table2.json (its columns marked from results/bench/lambda_band_cpu.json),
<table>.md for every vision table under results/vision/ and translation table under results/translation/;
the paper's values from results/paper/. See topklab.report.cli.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPKLAB_ROOT", str(Path(__file__).resolve().parents[1]))

from topklab.report.cli import tables as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
