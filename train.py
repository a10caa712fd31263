"""Run one training or table row (or a sweep with -m) from the Hydra configs in configs/.

python train.py                                  # STk + MLP on australian, offline
python train.py loss=atk dataset=german          # swap any config group
python train.py loss=stk dataset=cifar100lt      # image recipe: ResNet-32, logit-adjusted CE, SGD
python train.py -m loss=average,atk,matk,stk     # sweep
python train.py experiment=fmnistlt/la_stk       # a row of a results table
python train.py experiment=stk/table3/australian preset=full   # a tabular row: its cells (runner=tabular_cells)
torchrun --nproc_per_node 2 train.py ...         # DistributedDataParallel, one process per GPU
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
for arg in sys.argv[1:]:  # cpu_capability=<isa> pins torch's CPU kernels; torch reads it once, so before it loads
    if arg.startswith("cpu_capability=") and arg.partition("=")[2] not in ("", "null"):
        os.environ["ATEN_CPU_CAPABILITY"] = arg.partition("=")[2]

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import topklab.launch  # noqa: E402,F401  (registers the resolvers of configs/hydra/)
from topklab.cli import preflight  # noqa: E402
from topklab.engine.build import build  # noqa: E402
from topklab.launch.ranks import rank  # noqa: E402


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    if rank() == 0 and not any(o.lstrip("+~").startswith("recipe=") for o in hydra_cfg.overrides.task):
        print(f"recipe: {cfg.recipe} (the dataset's or the row's; choose another with recipe=<name>)")
    # A TopklabError is not caught here: hydra.callbacks.jobs (topklab.launch.callback) turns it into
    # `error: ...` + exit 2 for a single run, and into a recorded failure for a sweep job.
    runner = build(cfg.runner, "runner")  # runner=model trains one model; a tabular or synthetic row runs its protocol
    value = runner(
        cfg,
        hydra_cfg.runtime.output_dir,
        job_name=hydra_cfg.job.name,
        overrides=list(hydra_cfg.overrides.task),
        experiment=hydra_cfg.runtime.choices.get("experiment"),
    )
    if rank() == 0:
        print(f"run record: {hydra_cfg.runtime.output_dir}")
    return value


def cli() -> None:
    """What ``python train.py ARGS`` does: the one-line checks (config, output folder), then Hydra's
    run or sweep of the same command line, as written. A fault ends in ``SystemExit``: code 2 (or
    128 + a signal) after one line on stderr; a bug keeps its traceback (Hydra prints it, exit code 1)."""
    preflight(sys.argv[1:], ROOT / "configs")
    main()


if __name__ == "__main__":
    os.environ.setdefault(
        "PYTORCH_NVML_BASED_CUDA_CHECK", "1"
    )  # CUDA checks must not start CUDA before a sweep job is pinned to its GPU
    cli()
