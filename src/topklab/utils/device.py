"""The torch device an ``engine.device`` / ``device`` setting names."""

from __future__ import annotations

import torch

from topklab.utils.errors import TopklabError


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA where a device is visible, else CPU; ``cuda...`` without a visible CUDA device is
    a one-line :class:`TopklabError`; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TopklabError(f"engine.device={name} but no CUDA device is visible; use engine.device=cpu or auto")
    return torch.device(name)
