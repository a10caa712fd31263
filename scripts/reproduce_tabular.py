"""Reproduce the STk paper's tabular Tables 3, 4 and 6 by its protocol (one row per file under
configs/experiment/stk/table*/), storing one JSON per cell under results/tabular/<preset>/.

    python scripts/reproduce_tabular.py                          # quick preset, every row
    python scripts/reproduce_tabular.py preset=full row=stk/table3/australian
    python scripts/reproduce_tabular.py preset=full row=stk/table6/cpusmall individuals=[absolute] aggregates=[stk]
    python scripts/reproduce_tabular.py -m preset=full row=stk/table3/german,stk/table3/phoneme \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1   # rows in parallel

Rerunning skips stored cells; a killed run loses at most the cell in progress.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
for arg in sys.argv[1:]:  # cpu_capability=<isa> pins torch's CPU kernels; torch reads it once, so before it loads
    if arg.startswith("cpu_capability=") and arg.partition("=")[2] not in ("", "null"):
        os.environ["ATEN_CPU_CAPABILITY"] = arg.partition("=")[2]

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import topklab.launch  # noqa: E402,F401  (registers Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.cli import check_group_choices  # noqa: E402
from topklab.config import config_groups  # noqa: E402
from topklab.protocol.reproduce import reproduce, select_rows  # noqa: E402
from topklab.utils.errors import TopklabError, fail  # noqa: E402


@hydra.main(config_path="../configs", config_name="reproduce_tabular", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # A TopklabError leaves the task: Hydra's job callback (topklab.launch) prints it and exits 2,
    # or records it as a failed job of a sweep while the other rows run on.
    records = reproduce(cfg)
    print(f"{len(records)} cells in {cfg.results_dir}; `make tables` writes results/tables/")


def preflight(argv: list[str]) -> None:
    """Unknown presets, rows, or overrides meant for train.py fail in one line before any job runs."""
    args = [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]
    train_groups = set(config_groups(ROOT / "configs")) - {"paths", "preset"}
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in train_groups:
            raise TopklabError(
                f"{key}= is a train.py option; rows choose datasets and losses here "
                f"(row=stk/table3/<dataset>, aggregates=[...])"
            )
        if key == "row" and value != "all":
            select_rows(ROOT / "configs", [v.strip() for v in value.strip("[]").split(",")])
    check_group_choices(args, ROOT / "configs", exclude=("hydra",))


if __name__ == "__main__":
    try:
        preflight(sys.argv[1:])
    except TopklabError as err:
        fail(err)
    main()
