"""Learning-rate schedules as a per-step multiplier of the optimizer's base rate."""

from __future__ import annotations

import math

from topklab.utils.checks import check_int

SCHEDULES = ("constant", "cosine", "step", "inverse_sqrt")


class LRFactor:
    """``factor(step)``: linear warm-up over ``warmup_epochs`` (or ``warmup_steps`` when given),
    then constant, cosine (to ``min_lr_ratio``), step decay (× ``gamma`` at each epoch in
    ``milestones``) or inverse square root (Vaswani et al. 2017), which counts updates as fairseq's
    ``inverse_sqrt`` does: ``step / warmup`` during the warm-up (the first update at rate 0), then
    ``sqrt(warmup / step)``.

    A plain object (not a closure), so ``LambdaLR.state_dict()`` saves it and resume restores it.

    Examples
    --------
    >>> f = LRFactor("cosine", steps_per_epoch=10, epochs=2, warmup_epochs=1)
    >>> [round(f(s), 3) for s in (0, 9, 10, 15, 19)]
    [0.1, 1.0, 1.0, 0.5, 0.024]
    >>> LRFactor("step", 10, 200, milestones=[160, 180], gamma=0.01)(1700)
    0.01
    >>> [LRFactor("inverse_sqrt", 10, 200, warmup_steps=4)(s) for s in (0, 2, 4, 16)]
    [0.0, 0.5, 1.0, 0.5]
    >>> [round(LRFactor("cosine", 10, 10, per_epoch=True)(s), 5) for s in (0, 9, 10, 95)]  # PEL: lr 0.01 → .00976 …
    [1.0, 1.0, 0.97553, 0.02447]
    """

    def __init__(
        self,
        name: str,
        steps_per_epoch: int,
        epochs: int,
        warmup_epochs: float = 0.0,
        milestones=(),
        gamma: float = 0.1,
        min_lr_ratio: float = 0.0,
        warmup_steps: int | None = None,
        per_epoch: bool = False,
    ):
        if name not in SCHEDULES:
            raise ValueError(f"schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
        if warmup_epochs < 0 or not 0 < gamma <= 1 or not 0 <= min_lr_ratio <= 1:
            raise ValueError("schedule needs warmup_epochs >= 0, 0 < gamma <= 1 and 0 <= min_lr_ratio <= 1")
        check_int("schedule.warmup_steps", warmup_steps, 0, allow_none=True)
        if name == "inverse_sqrt" and not (warmup_steps or warmup_epochs):
            raise ValueError("schedule inverse_sqrt needs warmup_steps (or warmup_epochs) > 0")
        self.name = name
        self.steps_per_epoch = steps_per_epoch
        self.total = steps_per_epoch * epochs
        self.warmup = warmup_steps if warmup_steps is not None else int(round(warmup_epochs * steps_per_epoch))
        self.milestones = sorted(int(m) * steps_per_epoch for m in milestones)
        self.gamma = gamma
        self.min_lr_ratio = min_lr_ratio
        self.per_epoch = bool(per_epoch)

    def __call__(self, step: int) -> float:
        if self.per_epoch:
            step -= step % self.steps_per_epoch
        if self.name == "inverse_sqrt":
            return step / self.warmup if step < self.warmup else (self.warmup / step) ** 0.5
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.name == "cosine":
            span = max(self.total - self.warmup, 1)
            progress = min((step - self.warmup) / span, 1.0)
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if self.name == "step":
            return self.gamma ** sum(step >= m for m in self.milestones)
        return 1.0
