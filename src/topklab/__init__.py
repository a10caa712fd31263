"""topklab: differentiable top-k learning, reproduction-grade.

Importing the package first makes torchvision importable on CPU-only torch builds
(see :mod:`topklab.compat.torchvision_cpu`); it does nothing where torchvision's ops load.
"""
from topklab.compat.torchvision_cpu import ensure_torchvision_importable

ensure_torchvision_importable()

__version__ = "0.1.0"
