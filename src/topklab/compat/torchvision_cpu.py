"""Make ``import torchvision`` work with a CPU-only torch build.

The only torchvision wheels on PyPI are CUDA builds. Their ``_C.so`` needs ``libtorch_cuda.so``;
with CPU torch the extension fails to load silently and ``torchvision._meta_registrations``
then registers fake kernels for ``torchvision::nms``/``qnms`` that were never defined, which
raises at import. Defining the two schemas first lets the import succeed; ``torchvision.ops``
and ``torchvision.io`` stay unusable (no kernels), models/transforms/datasets work.

Where ``_C.so`` loads (a CUDA machine) this does nothing.
"""

from __future__ import annotations

import importlib.util
import os

import torch

_schema_library: torch.library.Library | None = None


def ensure_torchvision_importable() -> bool:
    """Define torchvision's nms/qnms schemas if its compiled ops cannot load.

    Returns True when the schemas were defined here, False when nothing was needed
    (torchvision absent, already imported, or its ops load).
    """
    global _schema_library
    if _schema_library is not None:
        return True
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
        return False
    except Exception:  # noqa: BLE001 - any load failure means "no compiled ops"
        pass
    try:
        _ = torch.ops.torchvision.nms  # already defined (e.g. torchvision imported earlier)
        return False
    except (AttributeError, RuntimeError):
        pass
    _schema_library = torch.library.Library("torchvision", "DEF")
    _schema_library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _schema_library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return True
