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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
for arg in sys.argv[1:]:  # cpu_capability=<isa> pins torch's CPU kernels; torch reads it once, so before it loads
    if arg.startswith("cpu_capability=") and arg.partition("=")[2] not in ("", "null"):
        os.environ["ATEN_CPU_CAPABILITY"] = arg.partition("=")[2]

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import topklab.launch  # noqa: E402,F401  (registers Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.cli import preflight  # noqa: E402
from topklab.config import expand_group_globs  # noqa: E402
from topklab.engine.build import build  # noqa: E402
from topklab.utils.errors import TopklabError, fail  # noqa: E402


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    if os.environ.get("RANK", "0") == "0" and not any(
        o.lstrip("+~").startswith("recipe=") for o in hydra_cfg.overrides.task
    ):
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
    print(f"run record: {hydra_cfg.runtime.output_dir}")
    return value


def quiet_rank_overrides() -> list[str]:
    """Under torchrun, ranks other than 0 keep Hydra's run directory and logs out of outputs/:
    the main rank writes the run's one record."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return []
    return [
        "hydra.output_subdir=null",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
        f"hydra.run.dir={tempfile.gettempdir()}/topklab-rank{rank}",
    ]


def cli(argv: list[str]) -> None:
    """What ``python train.py ARGV`` does: the one-line checks (config, output folder), then Hydra's
    run or sweep. A fault ends in ``SystemExit``: code 2 (or 128 + a signal) after one line on
    stderr; a bug keeps its traceback (Hydra prints it, exit code 1)."""
    try:
        argv = expand_group_globs(list(argv), ROOT / "configs")
    except TopklabError as err:
        fail(err)
    preflight(argv, ROOT / "configs")
    at = next((i for i, arg in enumerate(argv) if arg.startswith("--")), len(argv))
    argv[at:at] = quiet_rank_overrides()  # overrides go before Hydra's --cfg/--resolve flags
    sys.argv[1:] = argv  # Hydra reads its command line from sys.argv
    main()


if __name__ == "__main__":
    os.environ.setdefault(
        "PYTORCH_NVML_BASED_CUDA_CHECK", "1"
    )  # CUDA checks must not start CUDA before a sweep job is pinned to its GPU
    cli(sys.argv[1:])
