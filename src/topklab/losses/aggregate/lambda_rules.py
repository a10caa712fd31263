"""How the threshold λ of MATk and STk follows the losses: one rule per way, and the one table
(:data:`RULES`) of the names users write (``lam_update=`` of :class:`~topklab.losses.STk` and
:class:`~topklab.losses.MATk`, the loss configs, the router, the population executor, the tabular
preset).

A rule owns λ's storage on the module that holds it (registered there, so that ``state_dict``,
``.to()`` and a resume see it), the λ of a training call and of an evaluation call, λ's optimizer
group, its checks and its repr:

- :class:`Tracked` (``"track"``): λ is one call behind; each training call uses the λ the last
  call stepped to and steps once towards this batch's root in the same pass over the losses.
- :class:`Solved` (``"solve"``): each training call puts λ at the batch's root (STk:
  ``solve_steps`` safeguarded steps from the last root; MATk: the exact k-th largest loss).
- :class:`Adaptive` (``"adaptive"``, the library default): solved on short rows (2,048 losses for
  STk, 256 for MATk, with up to 8 steps), tracked from there on.
- :class:`Trained` (``"gradient"``): λ is a parameter the optimizer trains with the model (the
  paper's SGD-STk, papers.md §1.5).

Where a rule sets λ to ℓ_[k] exactly (MATk's solve, the first call of a stored rule, ``lam_init="auto"``),
ReLU's slope at zero would give the loss at ℓ_[k] no gradient: :func:`split_tie_mass` gives it
(k/n)·ATk's gradient instead.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from topklab.losses.aggregate.solve import (
    kth_largest,
    relu_threshold_step,
    relu_window,
    solve_srelu_threshold,
    srelu_threshold_step,
)
from topklab.utils.checks import check_int
from topklab.utils.k import resolve_k

STORED_SMOOTHINGS = ("srelu", "relu")  # smoothings whose λ a stored rule can solve or step


def split_tie_mass(losses: torch.Tensor, lam: torch.Tensor, k: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The gradient mass that (k/n)·ATk gives and ReLU's zero slope at λ = ℓ_[k] does not: for each
    row p of ``losses`` (P, n), ``step_p·(k_p − #{ℓ > λ_p}) / #{ℓ = λ_p}`` on each loss tied at λ_p,
    0 elsewhere (``step`` = s/n, the output scale over n).

    Examples
    --------
    >>> split_tie_mass(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), torch.tensor([3.0]), torch.tensor([2.0]), torch.tensor([0.25]))
    tensor([[0.0000, 0.2500, 0.2500, 0.0000]])
    """
    ties = losses == lam[:, None]
    above = (losses > lam[:, None]).sum(1).to(losses.dtype)
    mass = step * ((k - above) / ties.sum(1).clamp(min=1).to(losses.dtype))
    return torch.where(ties, mass[:, None], torch.zeros((), dtype=losses.dtype, device=losses.device))


class LambdaRule:
    """How λ follows the losses; see the module docstring. One instance per holder.

    Parameters
    ----------
    solve_steps : int >= 1
        Safeguarded solve steps per solved call (SReLU; MATk's solve is a selection).
    lam_momentum : float in (0, 1]
        The running average's weight of each new λ (as BatchNorm's momentum): λ outside training.
    lam_lr : float > 0 or None
        :class:`Trained` only: λ's own learning rate (its own group, no schedule); None: the model's.
    """

    name = ""
    stored = True  # λ a buffer the rule sets (False: a parameter the optimizer trains)
    tracks = False  # whether some training calls step λ from the last call's (MATk then keeps a window)

    def __init__(self, solve_steps: int = 2, lam_momentum: float = 0.1, lam_lr: float | None = None):
        check_int("solve_steps", solve_steps, why="solve steps per training call")
        if isinstance(lam_momentum, bool) or not isinstance(lam_momentum, (int, float)) or not 0 < lam_momentum <= 1:
            raise ValueError(
                f"lam_momentum={lam_momentum!r} must lie in (0, 1] (the running average's weight of the newest "
                f"root, as BatchNorm's momentum)"
            )
        if lam_lr is not None and (
            isinstance(lam_lr, bool)
            or not isinstance(lam_lr, (int, float))
            or not (lam_lr > 0 and math.isfinite(lam_lr))
        ):
            raise ValueError(f"lam_lr={lam_lr!r} must be a positive number, or null for the model's learning rate")
        if lam_lr is not None and self.stored:
            raise ValueError(
                f"lam_lr applies to lam_update='gradient'; with lam_update={self.name!r} λ is not trained (set lam_lr=null)"
            )
        self.solve_steps, self.lam_momentum, self.lam_lr = solve_steps, float(lam_momentum), lam_lr
        if type(self).__init__ is LambdaRule.__init__:
            self._fix()

    SETTINGS = ("solve_steps", "lam_momentum", "lam_lr", "track_from")  # fixed once the rule is built

    def __setattr__(self, name, value):
        if name in self.SETTINGS and getattr(self, "_fixed", False):
            raise AttributeError(
                f"{type(self).__name__}'s settings are fixed once built (the C++ lane and the Triton launches keep "
                f"them); build another rule, e.g. rule_for({self.name!r}, {name}=...)"
            )
        super().__setattr__(name, value)

    def _fix(self) -> None:
        """No setting changes from here on (called at the end of ``__init__``)."""
        object.__setattr__(self, "_fixed", True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings_repr()})"

    def settings_repr(self, holder=None) -> str:
        """The rule's settings as a holder's repr shows them (MATk's solve has no steps)."""
        steps = "" if holder is not None and holder.smoothing == "relu" else f"solve_steps={self.solve_steps}, "
        return f"{steps}lam_momentum={self.lam_momentum}"

    # ---- storage ----------------------------------------------------------------------------------
    def attach(self, holder: nn.Module, shape: tuple, start: float) -> None:
        """Register λ's storage on ``holder``: ``lam`` (λ outside training), ``lam_last`` (the warm
        start: the last training call's λ), MATk's tracking window ``lam_width``, and ``lam_started``."""
        if holder.smoothing not in STORED_SMOOTHINGS:
            raise ValueError(
                f"lam_update={self.name!r} needs smoothing in {', '.join(STORED_SMOOTHINGS)}, got "
                f"{holder.smoothing!r}; use lam_update='gradient' for the Table 2 ablation's smoothings"
            )
        if holder.lam_constraint != "none":
            raise ValueError(
                f"lam_constraint={holder.lam_constraint!r} applies to a λ trained by the optimizer; with "
                f"lam_update={self.name!r} λ is the root itself (set lam_constraint=none)"
            )
        holder.register_buffer("lam", torch.full(shape, start))
        holder.register_buffer("lam_last", torch.full(shape, start))
        if holder.smoothing == "relu" and self.tracks:
            holder.register_buffer("lam_width", torch.zeros(shape))
        holder.register_buffer("lam_started", torch.tensor(False))

    def parameter_groups(self, holder) -> list[dict]:
        return []

    def eval_lam(self, holder, rows: torch.Tensor) -> torch.Tensor:
        """λ (P,) of a call outside training: the running average."""
        return holder.lam.to(rows.dtype).expand(rows.shape[0])

    # ---- a training call ---------------------------------------------------------------------------
    def training_lam(self, holder, rows, k, count, delta):
        """(λ (P,), the smoothed share above it or None, whether λ is ℓ_[k] exactly) of a training call
        on detached ``rows`` (P, n) at counts ``k`` (P,); stores what the next call needs."""
        raise NotImplementedError

    def lane(self, holder, n: int) -> str | None:
        """How the C++ one-row call (``thresholded_cpu.cpp``'s ``row_call``) runs this rule's started
        training call at n losses: "tracked", "solved", "at_lambda", or None (the general path)."""
        return None

    def uses_last(self, holder, n: int) -> bool:
        """Whether a training call on one row of n losses uses the stored ``lam_last`` as it is (a
        tracked call: λ one call behind)."""
        return False

    def solve(self, holder, rows, k, count, delta, window: bool = False):
        """Each row's root (MATk: ℓ_[k]), stored; see :meth:`training_lam`. ``window``: MATk's tracking
        window is started from the rows too (a tracked rule's first call)."""
        shared = holder.rows is None and rows.shape[0] > 1
        if holder.smoothing == "relu":
            lam, share = kth_largest(rows, k if count is None else count), None
            if window:
                store_width(holder, relu_window(rows))
            self.store(holder, lam)
            return lam, share, True
        if shared:  # rows that share one stored λ: each from its own k-th largest, not from one warm start
            start = kth_largest(rows, k if count is None else count)
        else:
            if not holder._started and holder.lam_init == "auto":
                kth = kth_largest(rows, k if count is None else count)
                holder.lam_last.copy_(kth if holder.rows is not None else kth.mean())
            start = holder.lam_last.expand(rows.shape[0])
        lam, smoothed = self.roots(holder, rows, k, delta, start, self.steps_at(rows.shape[1]))
        self.store(holder, lam)
        return lam, smoothed.sum() / rows.numel(), False

    def steps_at(self, n: int) -> int:
        return self.solve_steps

    def roots(self, holder, rows, k, delta, start, steps=None):
        """Each row's root (P,) of ``rows`` (P, n) and the smoothed count there (SReLU), from ``start``."""
        return solve_srelu_threshold(
            rows,
            k,
            delta,
            start,
            steps or self.solve_steps,
            holder.path_for(rows),
            holder.kernel not in ("auto", "triton"),
        )

    def step(self, holder, rows, k, delta):
        """A tracked call: the λ it uses (the last call's step), stored one step on; see :meth:`training_lam`."""
        lam = holder.lam_last.to(rows.dtype, copy=True).expand(rows.shape[0])  # a copy: store() overwrites the buffer
        if holder.smoothing == "relu":
            width = holder.lam_width.to(rows.dtype).expand(rows.shape[0])
            stepped, width, count = relu_threshold_step(rows, k, lam, width)
            store_width(holder, width)
        else:
            stepped, count = srelu_threshold_step(rows, k, delta, lam)
        self.store(holder, stepped)
        return lam, count.sum() / rows.numel(), False

    def store(self, holder, lam: torch.Tensor) -> None:
        """The warm start and the running average from the rows' new λ (P,): each row's own under
        ``rows``, else the mean of the rows' finite values (a non-finite λ leaves them as they were)."""
        with torch.no_grad():
            finite = torch.isfinite(lam)
            if holder.rows is not None:
                root, valid = lam.to(holder.lam.dtype), finite
            else:
                found = finite.sum()
                root = (torch.where(finite, lam, torch.zeros_like(lam)).sum() / found.clamp(min=1)).to(holder.lam.dtype)
                valid = found > 0
            holder.lam_last.copy_(torch.where(valid, root, holder.lam_last))
            average = (1.0 - self.lam_momentum) * holder.lam + self.lam_momentum * root if holder._started else root
            holder.lam.copy_(torch.where(valid, average, holder.lam))
        mark_started(holder)

    # ---- a population of members (engine/population.py) ----------------------------------------------
    def member_lam(self, holder, losses, k, delta, lam, first: bool):
        """For a population of members (``engine/population.py``), each a row of ``losses`` (P, n)
        with its stored λ (P,), as :meth:`training_lam` does for one module per member: (the λ each
        uses (P,), the λ each stores for its next step, whether λ is ℓ_[k] exactly); None where the
        optimizer trains λ. ``first``: the members' first step (a stored rule's start)."""
        if holder.smoothing == "relu":
            root = kth_largest(losses, k)
            return root, root, True
        root, _ = self.roots(holder, losses, k, delta, lam, self.steps_at(losses.shape[1]))
        return root, root, False


def mark_started(holder) -> None:
    """λ is started: the buffer ``lam_started`` (saved with the module) and its host copy ``_started``
    (read on every call without a device read)."""
    if not holder._started:  # once: not an op on every call
        with torch.no_grad():
            holder.lam_started.fill_(True)
        holder._started = True


def store_width(holder, width: torch.Tensor) -> None:
    """MATk's tracking window from the rows' new windows (P,): each row's under ``rows``, else the
    mean of the finite ones (a row with a NaN loss keeps the stored one)."""
    with torch.no_grad():
        width = width.to(holder.lam_width.dtype)
        finite = torch.isfinite(width)
        if holder.rows is None:
            found = finite.sum()
            width = torch.where(finite, width, torch.zeros_like(width)).sum() / found.clamp(min=1)
            finite = found > 0
        holder.lam_width.copy_(torch.where(finite, width, holder.lam_width))


class Solved(LambdaRule):
    """``"solve"``: every training call puts λ at the batch's root, each row its own (STk:
    ``solve_steps`` safeguarded steps warm-started from the last root; rows that share one stored λ
    each start from their own k-th largest loss; MATk: the exact k-th largest loss, with
    :func:`split_tie_mass`). λ is a buffer; the running average of the roots is λ outside training.
    Cost: ``solve_steps`` + 2 passes over the losses (MATk: a selection)."""

    name = "solve"

    def training_lam(self, holder, rows, k, count, delta):
        return self.solve(holder, rows, k, count, delta)

    def lane(self, holder, n):
        return "solved"


class Tracked(LambdaRule):
    """``"track"``: a training call uses the λ the previous call stepped to and, in the same pass
    over the losses, takes one safeguarded step towards this batch's root (MATk: a step within a
    window around λ). The first call solves as :class:`Solved` does, and so does a call on several
    rows that share one stored λ (the shared λ cannot be each row's last). One pass per call, about
    ``losses.mean()`` with its backward; λ one call behind, which on small i.i.d. batches is often
    out of band (``results/bench/lambda_rules_cpu.md``)."""

    name = "track"
    tracks = True

    def training_lam(self, holder, rows, k, count, delta):
        if not holder._started or (holder.rows is None and rows.shape[0] > 1):
            return self.solve(holder, rows, k, count, delta, window=True)
        return self.step(holder, rows, k, delta)

    def lane(self, holder, n):
        return "tracked"

    def uses_last(self, holder, n):
        return holder._started

    def member_lam(self, holder, losses, k, delta, lam, first):
        if holder.smoothing == "relu":
            raise ValueError(
                f"lam_update={holder.lam_update} for MATk tracks λ in a window (here {losses.shape[1]} losses a "
                f"member), which the population executor does not keep per member; use lam_update=solve or gradient"
            )
        if first:
            return super().member_lam(holder, losses, k, delta, lam, first)
        stepped, _ = srelu_threshold_step(losses, k, delta, lam)
        return lam, stepped, False


class Adaptive(LambdaRule):
    """``"adaptive"`` (the library default): :class:`Solved` on short rows, where one call behind is
    often out of band on i.i.d. batches and a solve is cheap, :class:`Tracked` (one pass) from
    ``track_from`` losses on. A solved row of n losses takes ``max(1, min(8, 512 // n))`` steps (about
    512 losses' worth of solve work a call: 8 steps on 16–64 losses, one from 512 on).

    Parameters
    ----------
    track_from : int >= 1 or None
        The shortest row that is tracked. None (default): 2,048 losses for STk, 256 for MATk (whose
        window tracks ℓ_[k] in band from fewer losses), where the tracked λ is in band on ≥ 0.9 of
        calls on i.i.d. batches (``results/bench/lambda_rules_cpu.md``).
    """

    name = "adaptive"
    tracks = True
    TRACK_FROM = {"srelu": 2048, "relu": 256}  # per smoothing: see track_from
    SOLVE_BUDGET, MOST_STEPS = 512, 8

    def __init__(self, solve_steps: int = 2, lam_momentum: float = 0.1, lam_lr: float | None = None,
                 track_from: int | None = None):  # fmt: skip
        super().__init__(solve_steps, lam_momentum, lam_lr)
        check_int("track_from", track_from, allow_none=True, why="the shortest row whose λ is tracked")
        self.track_from = track_from
        self._solved, self._tracked = Solved(solve_steps, lam_momentum), Tracked(solve_steps, lam_momentum)
        self._fix()

    def settings_repr(self, holder=None) -> str:
        return f"{super().settings_repr(holder)}, track_from={self.track_from}"

    def steps_at(self, n: int) -> int:
        return max(1, min(self.MOST_STEPS, self.SOLVE_BUDGET // max(n, 1)))

    def _shortest_tracked(self, holder) -> int:
        return self.TRACK_FROM[holder.smoothing] if self.track_from is None else self.track_from

    def _rule(self, holder, n: int) -> LambdaRule:
        return self._tracked if n >= self._shortest_tracked(holder) else self._solved

    def training_lam(self, holder, rows, k, count, delta):
        rule = self._rule(holder, rows.shape[1])
        if rule is self._solved:
            return self.solve(holder, rows, k, count, delta)
        return rule.training_lam(holder, rows, k, count, delta)

    def lane(self, holder, n):
        return self._rule(holder, n).lane(holder, n)

    def uses_last(self, holder, n):
        return self._rule(holder, n).uses_last(holder, n)

    def member_lam(self, holder, losses, k, delta, lam, first):
        if losses.shape[1] >= self._shortest_tracked(holder):
            return self._tracked.member_lam(holder, losses, k, delta, lam, first)
        return super().member_lam(holder, losses, k, delta, lam, first)


class Trained(LambdaRule):
    """``"gradient"``: λ is an ``nn.Parameter`` trained by the optimizer with the model, the paper's
    SGD-STk (papers.md §1.5). With ``lam_lr`` the engine gives it its own parameter group at that
    rate (no weight decay, no schedule); None keeps the model's rate and schedule. Under Adam λ moves
    about one learning rate per step, which cannot follow losses that fall by units per epoch (λ
    below every loss is the Average objective). Several rows share the one λ (its gradient collects
    every row's) unless the module is built with ``rows``."""

    name = "gradient"
    stored = False

    def settings_repr(self, holder=None) -> str:
        return f"lam_lr={self.lam_lr}" + ("" if holder is None else f", lam_init={holder.lam_init!r}")

    def attach(self, holder, shape, start):
        holder.lam = nn.Parameter(torch.full(shape, float(holder.lam_of(start))))
        holder.register_buffer("lam_started", torch.tensor(False))

    def parameter_groups(self, holder) -> list[dict]:
        group = {"params": [holder.lam], "weight_decay": 0.0}
        if self.lam_lr is not None:
            group.update(lr=float(self.lam_lr), constant_lr=True)
        return [group]

    def eval_lam(self, holder, rows):
        return holder.threshold.to(rows.dtype).expand(rows.shape[0])

    def training_lam(self, holder, rows, k, count, delta):
        at_kth = False
        if not holder._started:  # λ is ℓ_[k] of a row only where it started from that row alone
            alone = holder.rows is not None or rows.shape[0] == 1
            at_kth = holder.lam_init == "auto" and holder.smoothing == "relu" and alone
            self.start(holder, rows, k, count)
        return self.eval_lam(holder, rows), None, at_kth

    def start(self, holder, rows, k, count) -> None:
        """``lam_init="auto"``: λ starts at this first batch's k-th largest loss: each row's under
        ``rows``, else that of all the rows' losses together at the sum of their counts."""
        if holder.lam_init == "auto":
            with torch.no_grad():
                if holder.rows is None:
                    total = count * rows.shape[0] if count is not None else int(k.sum())
                    parts = [(rows.reshape(-1), total, rows.shape[0] == 1)]
                else:
                    parts = [(row, int(c), True) for row, c in zip(rows, k.tolist())]
                if holder.lam_constraint == "none":  # λ stored as it is: no host read (compile-friendly)
                    starts = torch.stack([_auto_start(holder, *part) for part in parts])
                    holder.lam.copy_(starts.to(holder.lam.dtype).view(holder.lam.shape))
                else:
                    starts = [holder.lam_of(float(_auto_start(holder, *part))) for part in parts]
                    holder.lam.copy_(torch.tensor(starts, dtype=holder.lam.dtype).view(holder.lam.shape))
        mark_started(holder)

    def lane(self, holder, n):
        return "at_lambda"

    def member_lam(self, holder, losses, k, delta, lam, first):
        return None


def _auto_start(holder, losses: torch.Tensor, total: int, one_row: bool) -> torch.Tensor:
    """The k-th largest of 1-D ``losses`` at the count ``total``; under torch.distributed, of the
    whole batch over the ranks, so that every replica starts alike and as one process would."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        local, losses = losses.numel(), _every_rank(losses)
        if one_row and not isinstance(holder.k, torch.Tensor):
            total = resolve_k(holder.k, losses.numel())
        else:
            total = min(losses.numel(), max(1, round(total * losses.numel() / local)))
    return kth_largest(losses, total)


def _every_rank(losses: torch.Tensor) -> torch.Tensor:
    """The 1-D losses of every rank, concatenated in rank order (ranks may hold different counts)."""
    world = torch.distributed.get_world_size()
    counts = [torch.zeros((), dtype=torch.long, device=losses.device) for _ in range(world)]
    torch.distributed.all_gather(counts, torch.tensor(losses.numel(), device=losses.device))
    longest = int(max(counts))
    padded = torch.cat([losses, losses.new_zeros(longest - losses.numel())])
    parts = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([part[: int(count)] for part, count in zip(parts, counts)])


class HoldsRule:
    """What a holder of a rule (``self.rule``) shows of it: its name and settings, read-only."""

    rule: LambdaRule

    @property
    def lam_update(self) -> str:
        """The name of λ's rule."""
        return self.rule.name

    @property
    def lam_lr(self) -> float | None:
        return self.rule.lam_lr

    @property
    def solve_steps(self) -> int:
        return self.rule.solve_steps

    @property
    def lam_momentum(self) -> float:
        return self.rule.lam_momentum


RULES: dict[str, type[LambdaRule]] = {rule.name: rule for rule in (Tracked, Solved, Adaptive, Trained)}
DEFAULT = Adaptive.name  # what MATk and STk use when lam_update is not given
PAPER = Trained.name  # the paper's update: the population executor's and the tabular preset's default


def rule_for(lam_update: str | LambdaRule | None, **settings) -> LambdaRule:
    """The rule named ``lam_update`` (None: the library default) built with ``settings`` (those given:
    the others at the rule's defaults), or a rule instance as it is (then no settings).

    Examples
    --------
    >>> rule_for("solve", solve_steps=4)
    Solved(solve_steps=4, lam_momentum=0.1)
    >>> rule_for(None).name
    'adaptive'
    """
    if isinstance(lam_update, LambdaRule):
        if settings:
            raise ValueError(
                f"lam_update is a rule object ({lam_update!r}); give {', '.join(sorted(settings))} to the rule, "
                f"not to the module"
            )
        return lam_update
    name = DEFAULT if lam_update is None else lam_update
    if name not in RULES:
        raise ValueError(f"unknown lam_update {name!r}; choose one of: {', '.join(RULES)}")
    return RULES[name](**settings)


def is_trained(lam_update: str | LambdaRule | None) -> bool:
    """Whether the rule named ``lam_update`` trains λ with the optimizer (the paper's update)."""
    rule = lam_update if isinstance(lam_update, LambdaRule) else RULES[DEFAULT if lam_update is None else lam_update]
    return not rule.stored
