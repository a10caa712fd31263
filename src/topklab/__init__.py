"""topklab: differentiable top-k learning, reproduction-grade.

Importing the package first makes torchvision importable on CPU-only torch builds
(see :mod:`topklab.compat.torchvision_cpu`); it does nothing where torchvision's ops load.
"""

from topklab.compat.torchvision_cpu import ensure_torchvision_importable

ensure_torchvision_importable()


def _version() -> str:
    """The installed distribution's version (pyproject.toml); "0+unknown" when run from a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("topklab")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
