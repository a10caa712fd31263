"""An alias of ``train.py`` for the STk paper's tabular Tables 3, 4 and 6, kept for its old command line.

    python scripts/reproduce_tabular.py                          # quick preset, every row
    python scripts/reproduce_tabular.py preset=full row=stk/table3/australian
    python scripts/reproduce_tabular.py preset=full row=stk/table6/cpusmall individuals=[absolute] aggregates=[stk]
    python scripts/reproduce_tabular.py preset=full row=stk/table3/german,stk/table3/phoneme \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1   # rows in parallel

runs, and prints first, the ``train.py`` command that does the same (``runner=tabular_cells``, which
the rows choose):

    python train.py -m experiment=<row>[,<row>...] [preset=<name>] [++runner.<key>=<value> ...] [other ...]

``row=all`` (the default) is every row of the three tables (``experiment=glob(...)``);
``aggregates``, ``individuals``, ``threads``, ``progress`` and ``results_dir`` are the runner's
fields; everything else (``preset.<field>=``, ``hydra...``, ``cpu_capability=``) goes to train.py
as it is, and train.py's checks refuse what does not reach the cells in one line. Cells are stored
under ``results/tabular/<preset>/``; rerunning skips stored cells.
"""

import os
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "train.py"
EVERY_ROW = "experiment=glob(include=[stk/table3/*,stk/table4/*,stk/table6/*])"
RUNNER_FIELDS = ("aggregates", "individuals", "threads", "progress", "results_dir")


def train_arguments(argv: list[str]) -> list[str]:
    """The train.py arguments for this script's ``argv``.

    Examples
    --------
    >>> train_arguments(["preset=full", "row=[stk/table3/german,stk/table3/phoneme]", "threads=1", "-m"])
    ['-m', 'experiment=stk/table3/german,stk/table3/phoneme', 'preset=full', '++runner.threads=1']
    >>> train_arguments([])[1]
    'experiment=glob(include=[stk/table3/*,stk/table4/*,stk/table6/*])'
    """
    rows, rest = EVERY_ROW, []
    for arg in argv:
        key, _, value = arg.partition("=")
        if arg == "-m":  # train.py always sweeps the rows
            continue
        if key == "row":
            rows = EVERY_ROW if value == "all" else f"experiment={value.strip('[]')}"
        elif key in RUNNER_FIELDS:  # ++: a sweep composes its base config before the rows choose runner=tabular_cells
            rest.append(f"++runner.{arg}")
        else:
            rest.append(arg)
    return ["-m", rows, *rest]


if __name__ == "__main__":
    arguments = train_arguments(sys.argv[1:])
    print("python train.py " + " ".join(arguments), flush=True)
    os.execv(sys.executable, [sys.executable, str(TRAIN), *arguments])
