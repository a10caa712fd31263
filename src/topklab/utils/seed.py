"""One training seed fanned out to python, numpy and torch; RNG state capture for resume."""

from __future__ import annotations

import os
import random
from contextlib import contextmanager

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class SeededNormal:
    """Standard normal draws for a stochastic operator or loss: with an int ``seed``, from one
    ``torch.Generator`` per device, seeded once when first used there (the same seed gives the same
    sequence of draws); with None, from torch's global generator (``torch.manual_seed`` governs it)."""

    def __init__(self, seed: int | None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed={seed!r} must be an int or null")
        self.seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def __call__(self, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """Draws of ``shape`` on ``like``'s device and dtype."""
        if self.seed is None:
            return torch.randn(shape, device=like.device, dtype=like.dtype)
        key = str(like.device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=like.device).manual_seed(self.seed)
        return torch.randn(shape, generator=self._generators[key], device=like.device, dtype=like.dtype)


@contextmanager
def deterministic_algorithms(enabled: bool):
    """Within the block, torch's deterministic kernels only (a warning where an op has none) and
    cuDNN without autotuning, so that a CUDA run repeats bit for bit and a resumed one ends where
    the uninterrupted one does; the previous settings come back after it. A CPU run is already
    deterministic."""
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for repeatable matmuls
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
