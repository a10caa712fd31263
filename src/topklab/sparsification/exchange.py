"""Data-parallel SGD in which each worker sends only k gradient entries, with error feedback,
simulated in one process with the arithmetic of an all-gather of sparse messages.

The engine splits every batch into ``workers`` contiguous shards (worker w gets shard w, as a
DistributedSampler would), runs forward/backward per shard, and hands each shard's gradient to
:meth:`SparseGradientExchange.collect`; :meth:`apply` then writes the sum of the messages into the
parameters' ``.grad`` for the optimizer. Per worker (Stich et al. 2018; Karimireddy et al. 2019)::

    e_w ← e_w + g_w                   (the residual: everything not sent yet)
    S_w = selector(|e_w|, k)          (k = ⌈keep_ratio · number of parameters⌉)
    send e_w[S_w];  e_w[S_w] ← 0
    g = Σ_w e_w[S_w]                  (what every worker receives and steps with)

so ``Σ_w e_w + Σ(everything sent so far) = Σ(every gradient computed so far)`` exactly. Each shard's
objective is weighted by its share of the batch, so with ``keep_ratio = 1`` g is the batch's gradient
(dense data-parallel SGD, per-shard BatchNorm statistics included).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from topklab.utils.checks import check_int


class SparseGradientExchange(nn.Module):
    """Top-k gradient sparsification with error feedback over ``workers`` simulated workers.

    Parameters
    ----------
    workers : int >= 1, simulated data-parallel workers (each gets 1/workers of every batch)
    keep_ratio : float in (0, 1], the fraction of the model's parameters each worker sends per step
        (1: dense, no selection)
    selector : a callable ``() -> module`` called once per worker (a Hydra ``_partial_`` of
        :mod:`topklab.sparsification.selectors`), ``module(magnitudes, k) -> indices``; unused when
        ``keep_ratio = 1``
    error_feedback : bool, keep what was not sent in the residual (False: drop it)

    Examples
    --------
    >>> from functools import partial
    >>> from topklab.sparsification import ExactTopK
    >>> exchange = SparseGradientExchange(workers=2, keep_ratio=0.5, selector=partial(ExactTopK))
    >>> weight = nn.Parameter(torch.zeros(4))
    >>> exchange.attach([weight])
    >>> weight.grad = torch.tensor([4.0, 0.0, 1.0, 0.0]); exchange.collect(0)
    >>> weight.grad = torch.tensor([0.0, 2.0, 0.0, 3.0]); exchange.collect(1)
    >>> exchange.apply(); weight.grad.tolist(), exchange.residual.sum(1).tolist()
    ([4.0, 2.0, 1.0, 3.0], [0.0, 0.0])
    """

    def __init__(self, workers: int = 4, keep_ratio: float = 0.01, selector=None, error_feedback: bool = True):
        super().__init__()
        check_int("gradient_exchange.workers", workers)
        if not 0 < keep_ratio <= 1:
            raise ValueError(f"gradient_exchange.keep_ratio={keep_ratio} must lie in (0, 1]")
        if keep_ratio < 1 and selector is None:
            raise ValueError(
                "gradient_exchange.selector is needed when keep_ratio < 1 (e.g. gradient_exchange=exact_topk)"
            )
        self.workers, self.keep_ratio, self.error_feedback = workers, keep_ratio, error_feedback
        self.selectors = nn.ModuleList(selector() for _ in range(workers)) if keep_ratio < 1 else nn.ModuleList()
        self.parameters_to_sync: list[nn.Parameter] = []
        self.register_buffer("residual", torch.zeros(0))
        self.register_buffer("aggregate", torch.zeros(0))
        self.overflow, self.pending = False, []  # fp16: a step's messages wait until no worker overflowed
        self.reset_counters()

    def attach(self, parameters) -> None:
        """Take the trainable parameters (call once, after the model is on its device)."""
        self.parameters_to_sync = [p for p in parameters if p.requires_grad]
        numel = sum(p.numel() for p in self.parameters_to_sync)
        device = self.parameters_to_sync[0].device
        self.residual = torch.zeros(self.workers, numel, device=device)
        self.aggregate = torch.zeros(numel, device=device)
        self.k = max(1, math.ceil(self.keep_ratio * numel))

    def shards(self, n: int) -> list[slice]:
        """Worker w's contiguous slice of a batch of n samples (sizes differ by at most one)."""
        if n < self.workers:
            raise ValueError(
                f"a batch of {n} samples cannot feed gradient_exchange.workers={self.workers}; "
                f"raise engine.batch_size or lower the workers"
            )
        bounds = [round(w * n / self.workers) for w in range(self.workers + 1)]
        return [slice(bounds[w], bounds[w + 1]) for w in range(self.workers)]

    def _flat_gradient(self) -> torch.Tensor:
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                for p in self.parameters_to_sync
            ]
        )

    def collect(self, worker: int, scale: float = 1.0) -> None:
        """Worker ``worker``'s message from the gradient now in ``.grad`` (which is then cleared).

        ``scale``: the loss scale of fp16 mixed precision (GradScaler's), divided out so that the
        residual holds true gradients. Under a scale the messages wait for :meth:`apply`: if any
        worker's gradient is non-finite (the scaler's overflow) no residual changes and the scaler
        gets a non-finite gradient, so it skips the step as it would without the exchange."""
        gradient = self._flat_gradient() / scale
        for p in self.parameters_to_sync:
            p.grad = None
        if scale != 1.0:
            self.overflow = self.overflow or not bool(torch.isfinite(gradient).all())
            self.pending.append((worker, gradient))
            return
        self._send(worker, gradient)

    def _send(self, worker: int, gradient: torch.Tensor) -> None:
        if self.keep_ratio == 1:
            self.aggregate += gradient
            self.sent += gradient.numel()
            return
        residual = self.residual[worker]
        residual += gradient
        start = time.perf_counter()
        indices = self.selectors[worker](residual.abs(), self.k)
        self.selection_seconds += time.perf_counter() - start
        self.aggregate.index_add_(0, indices, residual[indices])
        if self.error_feedback:
            residual[indices] = 0.0
        else:
            residual.zero_()
        self.sent += indices.numel()

    def apply(self, scale: float = 1.0) -> None:
        """Write the summed messages into ``.grad`` (times the fp16 loss ``scale``, which the scaler
        divides out again; all non-finite after an overflow, so the scaler skips the step) and start
        the next step."""
        if not self.overflow:
            for worker, gradient in self.pending:
                self._send(worker, gradient)
        self.pending = []
        offset = 0
        for p in self.parameters_to_sync:
            update = self.aggregate[offset : offset + p.numel()].view_as(p) * scale
            p.grad = (torch.full_like(update, math.inf) if self.overflow else update).to(p.dtype)
            offset += p.numel()
        self.aggregate.zero_()
        self.overflow = False
        self.messages += self.workers

    def reset_counters(self) -> None:
        self.sent, self.messages, self.selection_seconds = 0, 0, 0.0

    def epoch_summary(self) -> dict:
        """Since the last reset: the mean fraction of parameters a worker sent per step, and the
        selection time per worker message."""
        numel = self.residual.shape[1] if self.residual.numel() else 0
        messages = max(self.messages, 1)
        return {
            "sent_fraction": self.sent / (messages * numel) if numel else None,
            "selection_s": self.selection_seconds / messages,
            "residual_norm": float(self.residual.norm()) if self.residual.numel() else 0.0,
        }
