from __future__ import annotations

import math

import torch

from topklab.losses.aggregate.base import Aggregate, accumulation_dtype, mean_without_overflow
from topklab.losses.aggregate.kernels import native_if_loaded


class Average(Aggregate):
    """Average aggregate loss ``L_avg = (1/n)·Σ ℓ_i`` (STk paper §4, "Average"). A sum that overflows
    where the mean is finite (float32 losses near 3e38) is redone in float64, except for 1-D losses
    on a GPU, which get ``losses.mean()`` as it is (+inf there; the check would synchronise every
    call); ±inf propagate (+inf and −inf together give NaN), as does NaN. On a CPU, 1-D float32/float64
    losses take one C++ node of the prebuilt extension, ``top_mean_row`` of ``thresholded_cpu.cpp``, with
    ``x.mean()``'s value and gradient bit for bit; without it (never built for this), and where a tracer, a
    forward-mode tangent, a transform of torch.func or a dispatch mode watches the call, ``x.mean()`` itself.

    Parameters
    ----------
    dim : int
        The axis of the losses to average (default -1, the last); the other axes are rows, each
        averaged on its own (see :class:`~topklab.losses.aggregate.base.Aggregate`).

    Examples
    --------
    >>> Average()(torch.tensor([1.0, 2.0, 6.0]))
    tensor(3.)
    >>> Average()(torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]]))
    tensor([3., 1.])
    >>> Average(dim=0)(torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]], dtype=torch.bfloat16))
    tensor([0.5000, 1.0000, 4.5000], dtype=torch.bfloat16)
    """

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        # the usual case, 1-D losses, is x.mean() itself, its value and gradient bit for bit: on a CPU as one
        # C++ node where the extension is prebuilt or loaded (with the overflow check), else x.mean() checked for
        # overflow; on a GPU as it is (a check would synchronise every call)
        if type(losses) is torch.Tensor and self.dim in (-1, 0) and not torch.compiler.is_compiling():
            native = native_if_loaded()
            value = None if native is None else native.top_mean_row(losses, 0)
            if value is not None:
                return value
        if self.one_row(losses, cpu=False):
            plain = losses.mean()
            if not losses.is_cpu or (not torch.compiler.is_compiling() and not math.isinf(plain.item())):
                return plain
        return super().forward(losses)

    def batched(self, losses: torch.Tensor, k, lam, delta) -> torch.Tensor:
        work = losses.to(accumulation_dtype(losses.dtype))
        count = torch.full(work.shape[:1], work.shape[1], dtype=work.dtype, device=work.device)
        return mean_without_overflow(work.mean(1), work, count).to(losses.dtype)

    def extra_repr(self) -> str:
        return self._dim_repr().removeprefix(", ")
