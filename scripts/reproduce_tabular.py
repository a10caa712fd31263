"""Reproduce the STk paper's tabular Tables 3, 4 and 6 by its protocol (one row per file under
experiments/stk/), storing one JSON per cell under results/tabular/<preset>/.

    python scripts/reproduce_tabular.py                          # quick preset, every row
    python scripts/reproduce_tabular.py preset=full row=table3/australian
    python scripts/reproduce_tabular.py -m preset=full row=table3/german,table3/phoneme \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1   # rows in parallel

Rerunning skips stored cells; a killed run loses at most the cell in progress.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from topklab.cli import check_group_choices, fail  # noqa: E402
from topklab.protocol.reproduce import reproduce  # noqa: E402
from topklab.utils.errors import TopklabError  # noqa: E402


@hydra.main(config_path="../configs", config_name="reproduce_tabular", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        records = reproduce(cfg)
    except TopklabError as err:
        fail(err)
    print(f"{len(records)} cells in {cfg.results_dir}; `make tables` writes results/tables/")


if __name__ == "__main__":
    try:
        check_group_choices([a for a in sys.argv[1:] if not a.startswith("-")], ROOT / "configs", exclude=("hydra",))
    except TopklabError as err:
        fail(err)
    main()
