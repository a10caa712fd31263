"""Whether MATk/STk's threshold λ tracks the k-th largest loss, measured on every training call.

Where λ is optimal, the smoothed share of losses above it, the batch mean of φ'(ℓ − λ), equals
k/n exactly (the stationarity of Eq. 5/6 in λ). A call is **in band** when that share lies within
a factor 2 of k/n and its complement within a factor 2 of 1 − k/n. A λ below every loss (share 1)
trains the Average objective; a λ above them all (share 0) trains almost nothing. For k = n
MATk/STk is the average by definition and the band is undefined (None).

The band is on the smoothed share because, with a δ large against the losses' spread, the hard
share sits far from k/n even at the optimum. The hard share and λ against the batch's k-th largest
loss are sampled every ``sample_every`` calls (they need a pass and a selection).

A run is judged on its share of in-band calls after the burn-in (the first 10 % of its calls), or on
all its calls when none came after the burn-in: below :data:`PARTLY_BELOW` it is flagged
:data:`PARTLY_TRACKED_FLAG`, below :data:`FLAG_BELOW` :data:`LOW_BAND_FLAG` (not STk).
"""

from __future__ import annotations

import math
import warnings

import torch

LOW_BAND_FLAG = "λ did not track the k-th loss: this row is not STk"
FLAG_BELOW = 0.5  # a run with a smaller share of in-band steps is not STk
PARTLY_TRACKED_FLAG = "λ partly tracked the k-th loss"
PARTLY_BELOW = 0.9  # a run with a smaller share, but at least FLAG_BELOW, is partly tracked
AFTER_BURN_IN, ALL_STEPS = "after burn-in", "all steps"  # lambda_tracking's ``judged_on``
WARN_AFTER_CALLS = 100  # the library warns once after this many consecutive out-of-band calls


def in_band(share: torch.Tensor, target: float) -> torch.Tensor:
    """Whether the smoothed ``share`` above λ is within a factor 2 of ``target`` = k/n and its
    complement within a factor 2 of 1 − k/n (a bool tensor; ``target`` in (0, 1)).

    Examples
    --------
    >>> in_band(torch.tensor([0.96, 1.0, 0.93, 0.5]), 0.96).tolist()  # 1.0: nothing below λ (Average)
    [True, False, True, False]
    """
    below, target_below = 1.0 - share, 1.0 - target
    return (share <= 2 * target) & (share >= target / 2) & (below <= 2 * target_below) & (below >= target_below / 2)


class LambdaMonitor:
    """Counters of one MATk/STk module, updated without synchronising (on-device sums).

    ``record(share, k, n)`` after each training call; ``pop_epoch()`` returns the epoch's
    diagnostics (one synchronisation) and starts the next epoch's. Calls before ``burn_in`` (set by
    the engine to 10 % of the run's calls) count in ``in_band_all`` but not in ``in_band``.

    All the on-device state is one float64 vector (``SUMS``, then the calls seen and the
    out-of-band streak), updated in place as a whole. Under ``torch.compile`` the first call creates
    it inside the graph; separate 0-d counters made there were returned by inductor as one buffer
    wherever its joint-graph passes proved their values equal (the sums still at 0, or ``in_band``
    and ``in_band_all`` when that call is past the burn-in), so that every later call added to that
    buffer once per counter (twice the in-band hits). One vector cannot alias another counter.
    """

    SUMS = (
        "calls",
        "share_sum",
        "in_band_all",
        "counted",
        "in_band",
        "hard_share_sum",
        "lam_minus_kth_sum",
        "samples",
    )  # the epoch's sums: the first slots of the state vector, zeroed by pop_epoch
    _SAMPLED = slice(SUMS.index("hard_share_sum"), SUMS.index("samples") + 1)
    _SEEN, _STREAK = len(SUMS), len(SUMS) + 1  # the calls so far (what the burn-in compares), the streak

    def __init__(self, sample_every: int = 50):
        self.sample_every = sample_every
        self.burn_in = 0
        self.calls = 0
        self._state = None  # the epoch's SUMS, the calls seen, the out-of-band streak (float64, on the device)
        self._warned = False
        self.band_defined = True  # False once a call had k = n

    def move(self, fn) -> None:
        """Follow a module's ``_apply`` function (``.to()``, ``.cuda()`` …) to its device; the state
        stays float64 whatever dtype the module is converted to."""
        if self._state is not None:
            self._state = self._state.to(fn(self._state).device)

    @staticmethod
    def rows_in_band(shares: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Whether every row is in band: row shares (P,) against their k/n (P,) (a 0-d bool tensor;
        rows with k = n are left out)."""
        defined = targets < 1
        return (in_band(shares, targets.to(shares.dtype)) | ~defined).all()

    def record(self, share: torch.Tensor, k: int, n: int, sample=None, rows_in_band=None) -> None:
        """One training call: ``share`` the smoothed share above λ (0-d tensor), k of n losses;
        ``sample`` (on every ``sample_every``-th call) a callable giving ``(hard share, λ − ℓ_[k])``.

        Inside a user's ``torch.compile`` only the on-device sums are kept (no Python counter, which
        would recompile every call): the warning and the samples wait for eager calls."""
        if self._state is None:
            self._state = torch.zeros(len(self.SUMS) + 2, dtype=torch.float64, device=share.device)
            self._state[self._SEEN] = float(self.calls)
        compiling = torch.compiler.is_compiling()
        if not compiling:
            self.calls += 1
        state = self._state
        share = share.detach()
        share64 = share.double()
        one, zero = torch.ones_like(share64), torch.zeros_like(share64)
        self.band_defined = k < n
        if k < n:
            good = (in_band(share, k / n) if rows_in_band is None else rows_in_band).double()
            counted = (state[self._SEEN] + 1 > self.burn_in).double()  # after the burn-in: 1, else 0 (exact sums)
            kept = 1.0 - good  # the streak becomes streak · (1 − good) + (1 − good): + 1, or 0 when in band
            added = [one, share64, good, counted, good * counted, zero, zero, zero, one, kept]
        else:
            kept = one
            added = [one, share64, zero, zero, zero, zero, zero, zero, one, zero]
        keep = torch.cat([torch.ones(len(self.SUMS) + 1, dtype=torch.float64, device=state.device), kept.view(1)])
        state.mul_(keep).add_(torch.stack(added))  # × 1 and + 0 leave a slot bit for bit as it was
        if not compiling:
            self._after(lambda: share, k, n, sample)

    def native_call(self, k: int, n: int) -> bool:
        """Count a call whose sums the C++ lane adds to the state itself (``thresholded_cpu.cpp``'s
        ``record_call``, and ``sample_call`` when this returns True: the calls :meth:`record`
        samples); then :meth:`check_streak`."""
        self.calls += 1
        self.band_defined = k < n
        return self.calls % self.sample_every == 1 % self.sample_every

    def check_streak(self, share, k: int, n: int) -> None:
        """Warn once after :data:`WARN_AFTER_CALLS` consecutive out-of-band calls; ``share()`` gives
        the last smoothed share for the message (read only then)."""
        if k < n and self.calls % WARN_AFTER_CALLS == 0 and not self._warned:  # the lane calls this on those calls only
            if bool(self._state[self._STREAK] >= WARN_AFTER_CALLS):
                self._warned = True
                warnings.warn(
                    f"MATk/STk: λ has been out of band for {WARN_AFTER_CALLS} consecutive training calls "
                    f"(smoothed share above λ {float(share()):.3f}, k/n {k / n:.3f}); the loss is not top-k "
                    f"(use lam_update='track' or 'solve', or a larger lam_lr with lam_update='gradient')",
                    stacklevel=4,
                )

    def _after(self, share, k: int, n: int, sample) -> None:
        """An eager call's warning check and sample."""
        self.check_streak(share, k, n)
        if sample is not None and self.calls % self.sample_every == 1 % self.sample_every:
            self.add_sample(*sample())

    def add_sample(self, hard_share: torch.Tensor, gap: torch.Tensor) -> None:
        """Add one sample (the hard share of losses above λ, λ − ℓ_[k]) to the epoch's sums."""
        one = torch.ones((), dtype=torch.float64, device=self._state.device)
        self._state[self._SAMPLED] += torch.stack([hard_share.double(), gap.double(), one])

    EPOCH_FIELDS = (
        "lam_in_band",
        "lam_in_band_all",
        "lam_calls",
        "lam_in_band_counted",
        "lam_in_band_hits",
        "lam_in_band_all_hits",
        "smoothed_share",
        "hard_share",
        "lam_minus_kth",
    )

    def pop_epoch(self) -> dict:
        """The epoch's diagnostics (None where nothing was measured), then zero the epoch counters:

        - ``lam_in_band``: share of counted calls (after ``burn_in``) in band; ``lam_in_band_all``: of all calls;
        - ``lam_calls``, ``lam_in_band_counted``, ``lam_in_band_hits``, ``lam_in_band_all_hits``: the counts
          behind them (a run sums them, :func:`lambda_tracking`);
        - ``smoothed_share``: mean smoothed share above λ; ``hard_share``: mean sampled share of losses > λ;
        - ``lam_minus_kth``: mean sampled λ − ℓ_[k] (the batch's k-th largest loss).
        """
        if self._state is None:
            return dict.fromkeys(self.EPOCH_FIELDS)
        sums = self._state[: len(self.SUMS)]
        values = dict(zip(self.SUMS, sums.tolist()))
        sums.zero_()

        def ratio(num, den):
            return None if den == 0 else num / den

        banded = self.band_defined
        return {
            "lam_in_band": ratio(values["in_band"], values["counted"]) if banded else None,
            "lam_in_band_all": ratio(values["in_band_all"], values["calls"]) if banded else None,
            "lam_calls": int(values["calls"]),
            "lam_in_band_counted": int(values["counted"]) if banded else 0,
            "lam_in_band_hits": int(values["in_band"]),
            "lam_in_band_all_hits": int(values["in_band_all"]),
            "smoothed_share": ratio(values["share_sum"], values["calls"]),
            "hard_share": ratio(values["hard_share_sum"], values["samples"]),
            "lam_minus_kth": ratio(values["lam_minus_kth_sum"], values["samples"]),
        }

    def state_dict(self) -> dict:
        return {"calls": self.calls, "warned": self._warned}

    def load_state_dict(self, state: dict) -> None:
        self.calls, self._warned = int(state["calls"]), bool(state["warned"])
        if self._state is not None:  # the calls seen restart from ``calls``
            self._state[self._SEEN] = float(self.calls)


def lambda_tracking(history: list[dict]) -> dict:
    """The run's λ diagnostics from its epoch rows (:meth:`LambdaMonitor.pop_epoch`):

    - ``in_band``: in-band calls after the burn-in over the counted calls; when calls were made but
      none was counted (the run stopped within its burn-in), ``in_band_all``'s value; None when k = n
      or no call was made;
    - ``judged_on``: :data:`AFTER_BURN_IN` or :data:`ALL_STEPS`, the calls ``in_band`` is over (None
      where it is None);
    - ``in_band_all``: in-band calls over all calls;
    - ``smoothed_share``, ``hard_share``, ``lam_minus_kth``: the last epoch's;
    - ``flag``: :func:`flag_for` of ``in_band``.

    Examples
    --------
    >>> rows = [{"lam_calls": 10, "lam_in_band_counted": 9, "lam_in_band_hits": 2, "lam_in_band_all_hits": 2, "lam_in_band": 0.2}]
    >>> tracking = lambda_tracking(rows)
    >>> tracking["in_band"], tracking["judged_on"], tracking["flag"]
    (0.2222222222222222, 'after burn-in', 'λ did not track the k-th loss: this row is not STk')

    A run that stopped within its burn-in is judged on all its calls:

    >>> rows = [{"lam_calls": 4, "lam_in_band_counted": 0, "lam_in_band_hits": 0, "lam_in_band_all_hits": 3, "lam_in_band_all": 0.75}]
    >>> tracking = lambda_tracking(rows)
    >>> tracking["in_band"], tracking["judged_on"], tracking["flag"]
    (0.75, 'all steps', 'λ partly tracked the k-th loss')
    """

    def total(name):
        return sum(row.get(name) or 0 for row in history)

    banded = any(row.get("lam_in_band_all") is not None or row.get("lam_in_band") is not None for row in history)
    counted, calls = total("lam_in_band_counted"), total("lam_calls")
    in_band_all = total("lam_in_band_all_hits") / calls if banded and calls else None
    if banded and counted:
        in_band, judged_on = total("lam_in_band_hits") / counted, AFTER_BURN_IN
    elif in_band_all is not None:  # every call within the burn-in
        in_band, judged_on = in_band_all, ALL_STEPS
    else:
        in_band, judged_on = None, None
    last = history[-1] if history else {}
    return {
        "in_band": in_band,
        "judged_on": judged_on,
        "in_band_all": in_band_all,
        **{name: last.get(name) for name in ("smoothed_share", "hard_share", "lam_minus_kth")},
        "flag": flag_for(in_band),
    }


def flag_for(in_band_share: float | None) -> str | None:
    """The flag of a run in band on ``in_band_share`` of its judged steps: :data:`LOW_BAND_FLAG`
    below :data:`FLAG_BELOW`, :data:`PARTLY_TRACKED_FLAG` below :data:`PARTLY_BELOW`, else None
    (also for None or a non-finite share).

    Examples
    --------
    >>> flag_for(0.3), flag_for(0.55), flag_for(0.95), flag_for(None)
    ('λ did not track the k-th loss: this row is not STk', 'λ partly tracked the k-th loss', None, None)
    """
    if in_band_share is None or not math.isfinite(in_band_share):
        return None
    if in_band_share < FLAG_BELOW:
        return LOW_BAND_FLAG
    return PARTLY_TRACKED_FLAG if in_band_share < PARTLY_BELOW else None
