"""Train one model (or a sweep with -m) from the Hydra configs in configs/.

    python train.py                                  # STk + MLP on australian, offline
    python train.py loss=atk dataset=german          # swap any config group
    python train.py -m loss=average,atk,matk,stk     # sweep
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from topklab.cli import fail, preflight  # noqa: E402
from topklab.train.run import format_summary, train  # noqa: E402
from topklab.utils.errors import TopklabError  # noqa: E402


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    try:
        summary = train(cfg, hydra_cfg.runtime.output_dir, job_name=hydra_cfg.job.name)
    except TopklabError as err:
        fail(err)
    print(format_summary(summary))
    print(f"run record: {hydra_cfg.runtime.output_dir}")
    return summary["metrics"]["val"]["score"]


if __name__ == "__main__":
    preflight(sys.argv[1:], ROOT / "configs")
    main()
