"""Reproduce the STk paper's synthetic experiments (§4.2): Table 2, Figure 3 and Figure 4.

    python scripts/reproduce_synthetic.py                              # all three, 50 repeats
    python scripts/reproduce_synthetic.py experiments=[table2] repeats=10 task.covariance=intended

Writes results/synthetic/<experiment>.json; `make tables` and `make figures` render them.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from topklab.synthetic.experiment import run  # noqa: E402


@hydra.main(config_path="../configs", config_name="reproduce_synthetic", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)  # a TopklabError is printed as one line (exit 2) by Hydra's job callback (topklab.launch)


if __name__ == "__main__":
    main()
