"""The capabilities the training loop (:mod:`topklab.engine.loop`) calls at fixed points of a step
or an epoch, each a named idea of its own rather than a slice of the loop:

* :class:`MicroBatches` and :class:`GradientExchangeShards`: how a batch is split into
  forward/backward passes before one optimizer step (gradient accumulation, or simulated
  data-parallel workers that each send k gradient entries).
* :class:`Replicas`: what data parallelism under ``torchrun`` (DDP) adds to the loop: this rank's
  slice of a global batch, signals and loss sums agreed across ranks, BatchNorm buffers synced
  before evaluation.
* :class:`FiniteGuard`: when a non-finite loss is caught, and which state ``last_good.pt`` keeps.
* :class:`CheckpointAveraging`: the last N epoch-end weights kept and scored as one averaged model.
"""

from __future__ import annotations

import torch

from topklab.engine.distributed import Distributed, gather_concat, shard_slice
from topklab.engine.interrupt import pending_signal
from topklab.utils.errors import NonFiniteLossError


def average_states(states: list[dict]) -> dict:
    """The element-wise mean of floating-point entries of several state dicts (others: the last's)."""
    return {
        key: torch.stack([s[key].double() for s in states]).mean(0).to(value.dtype)
        if value.is_floating_point()
        else value
        for key, value in states[-1].items()
    }


def loss_scale(scaler: torch.amp.GradScaler) -> float:
    """The fp16 loss scale (1 without a GradScaler), to put gradients back in the loss's own units."""
    return scaler.get_scale() if scaler.is_enabled() else 1.0


class MicroBatches:
    """Gradient accumulation: a batch of n samples as passes over chunks of ``size`` samples (one
    chunk, the whole batch, when ``size`` is None), with one optimizer step per batch."""

    def __init__(self, size: int | None):
        self.size = size

    def attach(self, module, device: torch.device) -> None:
        """Nothing to place: the gradients stay where backward leaves them."""

    def chunks(self, n: int) -> list[slice]:
        size = self.size or n
        return [slice(start, min(start + size, n)) for start in range(0, n, size)]

    def collected(self, chunk: int, scaler) -> None:
        """Called after each chunk's backward; accumulation needs nothing."""

    def before_step(self, scaler) -> None:
        """Called before the optimizer step; the summed gradients are already in place."""

    def start_epoch(self) -> None:
        """Called at each epoch's start."""

    def epoch_summary(self) -> dict:
        return {}

    def checkpoint_parts(self) -> dict:
        """Named objects with ``state_dict``/``load_state_dict`` to keep in the checkpoint."""
        return {}


class GradientExchangeShards(MicroBatches):
    """Simulated data-parallel workers that each send only k gradient entries with error feedback
    (:class:`~topklab.sparsification.SparseGradientExchange`): a batch is split into the workers'
    shards, each shard's gradient is collected after its backward, and the optimizer steps with the
    sum of their messages; epoch rows add the exchange's counters."""

    def __init__(self, exchange):
        super().__init__(None)
        self.exchange = exchange

    def attach(self, module, device: torch.device) -> None:
        self.exchange.to(device)
        self.exchange.attach(module.parameters())

    def chunks(self, n: int) -> list[slice]:
        return self.exchange.shards(n)

    def collected(self, chunk: int, scaler) -> None:  # in the loss's own units: the fp16 loss scale divided out
        self.exchange.collect(chunk, scale=loss_scale(scaler))

    def before_step(self, scaler) -> None:
        self.exchange.apply(scale=loss_scale(scaler))

    def start_epoch(self) -> None:
        self.exchange.reset_counters()

    def epoch_summary(self) -> dict:
        return self.exchange.epoch_summary()

    def checkpoint_parts(self) -> dict:
        return {"exchange": self.exchange}


def batch_plan(micro_batch_size: int | None, gradient_exchange=None) -> MicroBatches:
    """How each training batch is split: the exchange's worker shards, or micro-batches."""
    return MicroBatches(micro_batch_size) if gradient_exchange is None else GradientExchangeShards(gradient_exchange)


class Replicas:
    """What DDP adds to the loop: every rank draws the same global batch and trains on its
    contiguous slice; a signal on any rank stops every rank; loss sums are averaged over ranks;
    buffers are broadcast from rank 0 before evaluation. In one process each is the identity."""

    def __init__(self, dist: Distributed):
        self.dist = dist

    def local(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of a global batch (the whole batch in one process)."""
        dist = self.dist
        return batch[shard_slice(len(batch), dist.rank, dist.world_size)] if dist.is_distributed else batch

    def interrupted(self) -> bool:
        """A signal reached this process (under DDP: any rank), checked once per step."""
        if not self.dist.is_distributed:
            return pending_signal() is not None
        flag = torch.tensor([float(pending_signal() is not None)], device=self.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def loss_sum(self, running: torch.Tensor) -> torch.Tensor:
        """The epoch's running loss sum, averaged over ranks (a collective under DDP)."""
        dist = self.dist
        return gather_concat(running.view(1)).sum() / dist.world_size if dist.is_distributed else running

    def sync_buffers(self, module) -> None:
        """DDP syncs buffers (BatchNorm statistics) only at training forwards: rank 0's before evaluating."""
        if not self.dist.is_distributed:
            return
        for buffer in module.buffers():
            torch.distributed.broadcast(buffer, src=0)


class FiniteGuard:
    """Catches a non-finite loss at every step (``each_step``: ``last_good.pt`` is then the state
    before the failing update) or at epoch ends and checkpoints only (no per-step device sync; the
    state kept is then the last finite checkpoint's). ``snapshot()`` copies the current state."""

    def __init__(self, each_step: bool, snapshot, step: int):
        self.each_step, self.snapshot = each_step, snapshot
        # without a per-step check, the state before a non-finite update is the last checkpoint's (finite when saved)
        self.last_state, self.last_step = None if each_step else snapshot(), step

    def check_chunk(self, objective: torch.Tensor, epoch: int, step: int) -> None:
        """A chunk's objective, before its backward (per-step checking only)."""
        if self.each_step and not torch.isfinite(objective):
            raise NonFiniteLossError(
                f"non-finite loss ({float(objective.detach())}) at epoch {epoch + 1}, step "
                f"{step + 1}; lower optim.lr, check the data, or set engine.amp=none",
                last_good_state=self.snapshot(),
            )

    def check(self, where: str, loss_sum: torch.Tensor, step: int) -> None:
        """An epoch's loss sum, at its end and before each checkpoint."""
        if torch.isfinite(loss_sum):
            if not self.each_step and self.last_step != step:  # once per step: epoch end, then checkpoint
                self.last_state, self.last_step = self.snapshot(), step
            return
        raise NonFiniteLossError(
            f"non-finite loss {where}; lower optim.lr or set engine.amp=none "
            f"(resume from the last finite checkpoint with engine.resume=true)",
            last_good_state=self.snapshot() if self.each_step else self.last_state,
        )


class CheckpointAveraging:
    """fairseq's ``average_checkpoints``: the last ``last`` epoch-end weights are kept beside the
    checkpoint (by the main rank) and their element-wise mean is scored on ``splits``."""

    def __init__(self, last: int, store, is_main: bool):
        self.last, self.store, self.is_main = last, store, is_main

    @property
    def enabled(self) -> bool:
        return bool(self.last) and self.store is not None

    def keep(self, epoch: int, module) -> None:
        if self.enabled and self.is_main:
            self.store.save_weights(epoch, module.state_dict(), keep=self.last)

    def score(self, module, evaluate, splits, restore: dict) -> dict:
        """Metrics of the averaged weights on ``splits``; the module is left in ``restore``."""
        epochs = self.store.weight_epochs()[-self.last :]
        module.load_state_dict(average_states([self.store.load_weights(e) for e in epochs]))
        scores = {"epochs": epochs, **{split: evaluate(split) for split in splits}}
        module.load_state_dict(restore)
        return scores
