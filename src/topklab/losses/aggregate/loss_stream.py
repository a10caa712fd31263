"""Per-step loss distributions of a real run, kept compactly, and replayed through a MATk/STk
module to measure whether its λ stays in band (:mod:`~topklab.losses.aggregate.lambda_monitor`).

A :class:`LossStream` keeps, for each training call, the batch size and the sorted losses (short
batches) or their quantiles at :data:`LEVELS` (dense in both tails, where λ sits for k near n or
near 0). :func:`replay` rebuilds each batch from them (the quantile function at the n mid-ranks),
feeds it to the aggregate, steps the given optimizer on λ alone (the model's part of the
gradient is not replayed: the losses are what the run saw) and counts in-band calls after the
first 10 %. With ``lam_update="solve"`` or ``"track"`` it also measures the running-average λ (the one used
outside training) on the next, not yet seen, batch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from topklab.losses.aggregate.lambda_monitor import in_band
from topklab.losses.aggregate.solve import solve_srelu_threshold
from topklab.smoothing import get_smoothing
from topklab.utils.k import resolve_k

LEVELS = tuple(
    sorted(
        {round(i / 200, 4) for i in range(21)}
        | {round(0.1 + i / 20, 4) for i in range(17)}
        | {round(0.9 + i / 200, 4) for i in range(21)}
    )
)
EXACT_UP_TO = 128  # batches of at most this many losses are kept whole


@dataclass
class LossStream:
    """The losses of ``steps`` training calls: each entry ``[n, v_1, …]`` with the sorted losses
    (n <= :data:`EXACT_UP_TO`) or the quantiles at :data:`LEVELS`; ``source`` says which run."""

    source: dict = field(default_factory=dict)
    steps: list[list[float]] = field(default_factory=list)
    lams: list[float] = field(default_factory=list)  # the λ each call used in the recorded run, where known

    def add(self, losses: torch.Tensor, lam: torch.Tensor | None = None) -> None:
        if lam is not None:
            self.lams.append(round(float(lam.detach()), 6))
        values = losses.detach().double().flatten().sort().values
        n = values.numel()
        if n > EXACT_UP_TO:
            values = torch.quantile(values, torch.tensor(LEVELS, dtype=torch.float64))
        self.steps.append([n, *[round(float(v), 6) for v in values]])

    def batch(self, step: int) -> torch.Tensor:
        """The losses of call ``step`` (float64): whole, or the quantile function at the mid-ranks."""
        n, *values = self.steps[step]
        n = int(n)
        values = torch.tensor(values, dtype=torch.float64)
        if values.numel() == n:
            return values
        ranks = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        levels = torch.tensor(LEVELS, dtype=torch.float64)
        index = torch.searchsorted(levels, ranks).clamp(1, len(LEVELS) - 1)
        low, high = levels[index - 1], levels[index]
        weight = (ranks - low) / (high - low)
        return values[index - 1] + weight * (values[index] - values[index - 1])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), separators=(",", ":")) + "\n")

    def recorded_in_band(
        self, k, smoothing: str, delta: float | None, skip: float = 0.1, optimal: bool = False
    ) -> float | None:
        """λ in band in the recorded run itself (from :attr:`lams`): the smoothed share above λ is
        the mean of ``smoothing``'s slope at ℓ − λ (SReLU of width ``delta``; ReLU's is the hard share).
        ``optimal``: the same for each batch's own optimal λ* instead (SReLU: the root of its equation;
        ReLU: the midpoint of ℓ_[k+1] and ℓ_[k]), which shows whether the band can be reached at all
        (ties at ℓ_[k], as hinge losses at 0, can put even λ* outside it). None where k = n (or
        ``optimal`` for another smoothing): MATk/STk is then Average and the band is undefined."""
        if optimal and smoothing not in ("srelu", "relu"):
            return None
        phi = get_smoothing(smoothing)
        width = torch.tensor(0.0 if delta is None else delta, dtype=torch.float64)
        hits = []
        for step in range(int(len(self.steps) * skip), len(self.steps)):
            losses = self.batch(step)
            n = losses.numel()
            count = resolve_k(k, n)
            if count >= n:
                continue
            lam = self._optimum(losses, count, smoothing, width) if optimal else self.lams[step]
            share = phi.slope(losses - lam, width, torch.ones((), dtype=torch.float64)).mean()
            hits.append(bool(in_band(share, count / n)))
        return sum(hits) / len(hits) if hits else None

    @staticmethod
    def _optimum(losses: torch.Tensor, count: int, smoothing: str, width: torch.Tensor) -> float:
        if smoothing == "relu":
            top = losses.topk(count + 1).values
            return float(0.5 * (top[-1] + top[-2]))
        one = torch.ones(1, dtype=torch.float64)
        lam, _ = solve_srelu_threshold(losses[None], count * one, width * one, float(losses.median()) * one, 60)
        return float(lam[0])

    def recorded_share_below(self, skip: float = 0.1) -> float:
        """The mean hard share of losses below the recorded λ, over the calls after the first ``skip``."""
        calls = range(int(len(self.steps) * skip), len(self.steps))
        return sum(float((self.batch(s) < self.lams[s]).double().mean()) for s in calls) / len(calls)

    @classmethod
    def load(cls, path: str | Path) -> LossStream:
        return cls(**json.loads(Path(path).read_text()))


def record_calls(aggregate, stream: LossStream):
    """Make ``aggregate.batched`` add row 0's losses and λ to ``stream`` on every call (a population
    executor's member 0); returns ``aggregate``."""
    batched = aggregate.batched

    def recorded(losses, k, lam, delta):
        stream.add(losses[0], None if lam is None else lam[0])
        return batched(losses, k, lam, delta)

    aggregate.batched = recorded
    return aggregate


def replay(stream: LossStream, aggregate, optimizer=None, scheduler=None, skip: float = 0.1) -> dict:
    """Feed the stream to ``aggregate`` (MATk/STk) as training calls; return

    - ``in_band``: share of calls after the first ``skip`` whose smoothed share above the λ they
      used (Σ ∂L/∂ℓ_i, scale "paper") is in band;
    - ``eval_in_band``: for ``lam_update="solve"`` or ``"track"``, the share of calls in the last half at which the
      running-average λ is in band on the next batch (None otherwise), and ``eval_share_below``,
      the mean share of that batch's losses below it;
    - ``hard_below``: mean share of losses below λ over the counted calls;
    - ``gradient_gap``: mean over counted calls of max_i |∂L/∂ℓ_i − 1/n|·n, how far the gradient is
      from Average's (0 when λ lies below every loss; about 1 when some losses lie well below λ).

    ``optimizer`` (over ``aggregate.parameters()``) and ``scheduler`` are stepped after each call.
    """
    counted, hits, eval_hits, eval_calls, below, gap, eval_below = 0, 0, 0, 0, 0.0, 0.0, 0.0
    first_counted = int(len(stream.steps) * skip)
    aggregate.train()
    for step in range(len(stream.steps)):
        losses = stream.batch(step).to(torch.float32).requires_grad_()
        n = losses.numel()
        k = resolve_k(aggregate.k, n)
        if optimizer is not None:
            optimizer.zero_grad()
        stored = aggregate.rule.stored
        stepping = aggregate.rule.uses_last(aggregate, n)  # this call uses the last λ
        used = aggregate.lam_last.detach().clone() if stepping else None
        aggregate(losses).backward()
        if optimizer is not None:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if step < first_counted or k >= n:
            continue
        share = losses.grad.double().sum()
        counted += 1
        hits += bool(in_band(share, k / n))
        lam = float((used if stepping else aggregate.lam_last if stored else aggregate.threshold).detach())
        below += float((losses.detach() < lam).double().mean())
        gap += float((losses.grad.double() - 1 / n).abs().max()) * n
        if stored and step >= len(stream.steps) // 2 and step + 1 < len(stream.steps):
            eval_calls += 1
            upcoming = stream.batch(step + 1)
            eval_hits += bool(_eval_in_band(aggregate, upcoming, k / n))
            eval_below += float((upcoming < float(aggregate.lam)).double().mean())
    return {
        "in_band": hits / counted if counted else None,
        "eval_in_band": eval_hits / eval_calls if eval_calls else None,
        "eval_share_below": eval_below / eval_calls if eval_calls else None,
        "hard_below": below / counted if counted else None,
        "gradient_gap": gap / counted if counted else None,
        "calls": len(stream.steps),
    }


def _eval_in_band(aggregate, losses: torch.Tensor, target: float) -> bool:
    """Whether the λ used outside training is in band on ``losses`` (the module in eval mode)."""
    aggregate.eval()
    leaf = losses.to(torch.float32).requires_grad_()
    aggregate(leaf).backward()
    aggregate.train()
    return bool(in_band(leaf.grad.double().sum(), target))
