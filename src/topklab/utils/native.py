"""The C++ extensions (``thresholded_cpu.cpp``, ``pav_cpu.cpp``): prebuilt with the package, else
built on first use.

``setup.py`` compiles each source into the package (the wheel, and ``pip install -e .`` as
``make setup`` runs it) against the torch it builds with, stamping the source's SHA-256 and that
torch's version into the module. :func:`load_native` imports such a prebuilt module where both
match (the source beside it, the torch imported), so nothing is compiled and no compiler is needed.
Otherwise (no prebuilt module, a source edited since, another torch, or ``TOPKLAB_PREBUILT=0``) it
says why once and builds the source with :func:`torch.utils.cpp_extension.load` (a C++ compiler
and ninja; cached on disk by torch and rebuilt when the source changes); a failure there is the
caller's to handle (the kernels fall back to their eager paths).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import torch

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = {  # the prebuilt module of each C++ source (setup.py's EXTENSIONS)
    "topklab.losses.aggregate._thresholded_cpu": PACKAGE_ROOT / "losses" / "aggregate" / "thresholded_cpu.cpp",
    "topklab.operators._pav_cpu": PACKAGE_ROOT / "operators" / "pav_cpu.cpp",
}

# -O3 with no fused multiply-add (the same rounding as the eager formulas) and `omp simd` loops;
# setup.py builds with the same flags
CFLAGS = ("-O3", "-fopenmp-simd", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")


def source_sha(source: Path) -> str:
    """The SHA-256 of a C++ source (what setup.py stamps into the module it builds)."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def prebuilt_mismatch(module: ModuleType, source: Path) -> str | None:
    """Why a prebuilt ``module`` cannot stand for ``source`` under the torch imported, or None."""
    if module.TORCH_VERSION != torch.__version__:
        return f"it was built against torch {module.TORCH_VERSION}, this is torch {torch.__version__}"
    if source.exists() and module.SOURCE_SHA != source_sha(source):
        return f"{source.name} changed since it was built (rebuild it: pip install --no-build-isolation -e .)"
    return None


def find_prebuilt(prebuilt: str, source: Path) -> tuple[ModuleType | None, str | None]:
    """(the prebuilt module ``prebuilt``, a dotted name, where it matches ``source`` and the torch
    imported, None), or (None, why not): an import, never a build."""
    if os.environ.get("TOPKLAB_PREBUILT", "1") == "0":
        return None, "TOPKLAB_PREBUILT=0"
    try:
        module = importlib.import_module(prebuilt)
    except ImportError as error:
        return None, f"it is not installed ({str(error).splitlines()[0]})"
    why = prebuilt_mismatch(module, source)
    return (module, None) if why is None else (None, why)


def load_native(prebuilt: str, source: Path, jit_name: str) -> ModuleType:
    """The extension of ``source``: the prebuilt module ``prebuilt`` (a dotted name) where it matches,
    else built on first use under ``jit_name`` (raises where it cannot be built)."""
    module, why = find_prebuilt(prebuilt, source)
    if module is not None:
        return module
    if "not installed" not in why:  # a missing module is a source checkout without `make setup`: no news
        warnings.warn(f"topklab: not using the prebuilt {prebuilt} ({why}); building {source.name}", stacklevel=3)
    return build(source, jit_name)


def build(source: Path, name: str) -> ModuleType:
    """``source`` compiled by torch.utils.cpp_extension.load (ninja from the ninja package where not on PATH)."""
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # the ninja package's binary, when its bin/ is not on PATH (an unactivated venv)
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    return load(name=name, sources=[str(source)], extra_cflags=list(CFLAGS))


def prebuilt_kernels() -> str:
    """Which C++ kernels this process runs: "prebuilt" where every extension (:data:`EXTENSIONS`) is
    prebuilt for its source and this torch; else, for each that is not, whether it builds here (tried
    now, cached by torch) or not, its losses then falling back to ``torch.compile``'s or the eager
    kernel, whose last bits differ. Part of a result's identity."""
    missing = [(name, source) for name, source in EXTENSIONS.items() if find_prebuilt(name, source)[0] is None]
    if not missing:
        return "prebuilt"
    return "; ".join(f"{name.rsplit('.', 1)[1]} {_builds(name, source)}" for name, source in missing)


@functools.cache
def _builds(prebuilt: str, source: Path) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_native(prebuilt, source, f"topklab_{source.stem.removesuffix('_cpu')}")
    except Exception:  # noqa: BLE001 - any failure to build means the fallback kernels run
        return "unavailable"
    return "built here"
