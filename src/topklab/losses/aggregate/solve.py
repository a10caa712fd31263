"""λ as the root of the batch's stationarity equation (``lam_update="solve"`` of MATk/STk), or
one step towards it per call (``lam_update="track"``: :func:`srelu_threshold_step` for STk,
:func:`relu_threshold_step` for MATk).

At its optimum over λ, STk's Eq. 6 satisfies ``Σ_i SReLU'_δ(ℓ_i − λ) = k``: the smoothed count of
losses above λ is k. :func:`solve_srelu_threshold` finds that root per row, sort-free, with a fixed
number of safeguarded steps warm-started from the last λ (Newton's among the losses, a power-law
step outside a pile of them: :func:`power_law_step`): no early exit, so no synchronisation and no
data-dependent Python branch. MATk's hard-ReLU equation ``#{ℓ_i > λ} = k``
has an interval of roots, ``[ℓ_[k+1], ℓ_[k])``; :func:`kth_largest` takes its upper end ℓ_[k], the
exact k-th largest loss (a selection, not sort-free), where MATk equals (k/n)·ATk.
"""

from __future__ import annotations

import torch

from topklab.losses.aggregate.kernels import native_solve
from topklab.smoothing import beyond_square, srelu_slope_and_curvature

NEWTON_ABOVE = 0.5  # power_law_step takes Newton's step where the q it reads is above this


def solve_srelu_threshold(
    losses: torch.Tensor,
    k: torch.Tensor,
    delta: torch.Tensor,
    start: torch.Tensor,
    steps: int,
    path: str = "eager",
    required: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``losses`` (P, n): λ with ``Σ_i SReLU'_δ(ℓ_i − λ) ≈ k``, and that smoothed count.

    Each step evaluates the excess ``e = Σ SReLU'(ℓ − λ) − k`` (decreasing in λ) and its first two
    derivatives, moves the bracket end on λ's side to λ, and takes :func:`power_law_step`'s point
    where it lies strictly inside the bracket, the bracket's midpoint otherwise. The bracket starts as ``[min ℓ − δ√(n/(n−k)),
    max ℓ + δ√(n/k)]`` (e > 0 and e < 0 there, from ``SReLU'(z) <= δ²/(4z²)`` for z < 0), λ at
    ``start`` clamped into it. The iterate with the smallest |e| is returned, so more steps never
    give a worse λ. For k = n the equation has no root (the count stays below n) and λ ends at the
    bracket's lower end, where STk equals the average to within δ/2.

    Infinite losses: the bracket is that of the finite ones, widened on the right for the m losses at
    +inf (each counts 1 at every λ: ``max ℓ + δ√(n/(k − m))``); a −inf counts 0. λ stays finite; where
    m >= k, or fewer than k losses exceed −inf, there is no root and λ ends at a bracket end. A row
    with a NaN loss gets λ = NaN.

    Parameters
    ----------
    losses : Tensor (P, n), detached
    k : Tensor (P,), counts in [1, n]
    delta : Tensor (P,), SReLU widths > 0
    start : Tensor (P,), the warm start (the last λ)
    steps : int >= 1, steps after the warm start's evaluation; from a warm start one or two usually
        reach the root's neighbourhood, also from several δ outside a pile of equal losses, where
        Newton's step on the count overshoots
    path : {"eager", "native"}, "native" runs the same steps in ``thresholded_cpu.cpp`` (float32 or
        float64 CPU rows: one pass over the losses per step, sums in float64) and falls back to the
        eager torch operations where that kernel is unavailable (:func:`~topklab.losses.aggregate.
        kernels.native_solve`), or raises there under ``required``; the two give the same count to
        float32 rounding near the root (λ itself may differ where the count is flat in λ, between two
        losses; far from the root in float32 the eager float32 sums can take another step)

    Returns
    -------
    (lam (P,), count (P,)): the returned λ and ``Σ_i SReLU'(ℓ_i − λ)`` there (the smoothed count above λ).

    Examples
    --------
    >>> losses = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    >>> one = torch.ones(1, dtype=torch.float64)
    >>> lam, count = solve_srelu_threshold(losses, 2 * one, 0.01 * one, torch.zeros(1, dtype=torch.float64), steps=30)
    >>> 2.0 < float(lam) < 3.0, round(float(count), 6)
    (True, 2.0)
    """
    if path == "native":
        solved = native_solve(losses, k, delta, start, steps, required)
        if solved is not None:
            return solved
    with torch.no_grad():
        n = losses.shape[1]
        low, high = _bracket(losses, k, delta)
        lam = torch.minimum(torch.maximum(start.to(losses.dtype), low), high)
        best, best_excess, best_count = lam, torch.full_like(lam, float("inf")), torch.full_like(lam, float(n))
        for _ in range(steps + 1):
            count, bend, change = _step_sums(losses, lam, delta)
            excess = count - k
            better = excess.abs() < best_excess
            best = torch.where(better, lam, best)
            best_excess = torch.where(better, excess.abs(), best_excess)
            best_count = torch.where(better, count, best_count)
            low = torch.where(excess > 0, lam, low)
            high = torch.where(excess > 0, high, lam)
            proposal = lam + power_law_step(count, excess, k, n, bend, change)
            lam = torch.where((proposal > low) & (proposal < high), proposal, 0.5 * (low + high))
        undefined = torch.isnan(losses).any(
            1
        )  # a NaN row has no root: λ is NaN there, as the batch's k-th loss would be
        return torch.where(undefined, float("nan"), best), torch.where(undefined, float("nan"), best_count)


def srelu_threshold_step(
    losses: torch.Tensor, k: torch.Tensor, delta: torch.Tensor, lam: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of :func:`solve_srelu_threshold` from ``lam`` per row of ``losses`` (P, n), for
    ``lam_update="track"``: the excess ``e = Σ SReLU'(ℓ − λ) − k`` at λ, the row's bracket with its
    end on λ's side moved to λ, and :func:`power_law_step`'s point where it lies strictly inside it,
    the bracket's midpoint otherwise; λ itself where e = 0 or where the step is below half λ's
    resolution (``λ + step`` rounds back to λ: the root to λ's precision) and δ is not (where δ is below
    it, losses tied at λ make the count jump within one step of λ, and the step bisects as one outside
    the bracket). ``thresholded_cpu.cpp``'s
    ``row_call`` (a tracked call) takes the same step from the sums of the pass that gives the value.

    Returns
    -------
    (next λ (P,), count (P,)): the stepped λ and the smoothed count ``Σ_i SReLU'(ℓ_i − λ)`` at the
    given λ; both NaN on a row with a NaN loss (whose stored λ the caller keeps).

    Examples
    --------
    >>> losses = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    >>> one = torch.ones(1, dtype=torch.float64)
    >>> lam = torch.zeros(1, dtype=torch.float64)
    >>> for _ in range(12):  # each call steps from the last call's λ: to the root of this (unchanging) batch
    ...     lam, count = srelu_threshold_step(losses, 2 * one, 0.01 * one, lam)
    >>> 2.0 < float(lam) < 3.0, round(float(count), 6)
    (True, 2.0)
    """
    with torch.no_grad():
        low, high = _bracket(losses, k, delta)
        count, bend, change = _step_sums(losses, lam, delta)
        excess = count - k
        low = torch.where(excess > 0, torch.maximum(low, lam), low)
        high = torch.where(excess > 0, high, torch.minimum(high, lam))
        proposal = lam + power_law_step(count, excess, k, losses.shape[1], bend, change)
        # a step below half λ's resolution rounds back to λ: the root to λ's precision, not a step out of
        # the bracket (bisecting there threw the root away on every few calls of an unchanging batch),
        # where δ is at least that resolution; below it SReLU' jumps within one step of λ (losses tied
        # at λ) and the step says nothing of the root: bisect
        resolution = torch.nextafter(lam.abs(), torch.full_like(lam, float("inf"))) - lam.abs()
        kept = ((proposal == lam) & (delta >= resolution)) | ((proposal > low) & (proposal < high))
        stepped = torch.where(kept, proposal, 0.5 * (low + high))
        undefined = torch.isnan(losses).any(1)
        nxt = torch.where(excess == 0, lam, stepped)
        return torch.where(undefined, float("nan"), nxt), torch.where(undefined, float("nan"), count)


WINDOW_LOSSES, WINDOW_SHARE = 4, 32  # MATk's tracking window aims at max(4, n/32) losses (thresholded_cpu.cpp)


def relu_threshold_step(
    losses: torch.Tensor, k: torch.Tensor, lam: torch.Tensor, width: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tracking step of MATk's λ per row of ``losses`` (P, n) from ``lam`` with the window
    ``width`` (``lam_update="track"``). MATk's count ``#{ℓ > λ}`` is a staircase with no slope to
    step on, so the step reads how many losses lie within the window on either side of λ: where
    ``e = #{ℓ > λ} − k`` losses too many (too few) lie above λ and the window above (below) holds
    m >= |e| of them, λ moves |e|/m of the way across it (to the |e|-th of them, were they evenly
    spaced) and the window is scaled towards holding ``max(4, n/32)`` losses (by ½ to 2); otherwise
    λ moves the whole window and the window doubles. λ stays within the finite losses' range and the
    window at least their mean spacing. ``thresholded_cpu.cpp``'s tracked ``row_call`` takes the same step.

    Returns
    -------
    (next λ (P,), next window (P,), count (P,)): NaN on a row with a NaN loss (the caller keeps its
    stored values there); ``count`` is ``#{ℓ > λ}`` at the given λ.

    Examples
    --------
    >>> losses = torch.arange(100.0)[None]  # ℓ_[10] = 90: ten losses above any λ in [89, 90)
    >>> lam, width = torch.tensor([50.0]), torch.tensor([8.0])
    >>> for _ in range(8):
    ...     lam, width, count = relu_threshold_step(losses, torch.tensor([10.0]), lam, width)
    >>> float(count), 89.0 <= float(lam) < 90.0
    (10.0, True)
    """
    with torch.no_grad():
        n = losses.shape[1]
        least, most = _finite_range(losses)
        z = losses - lam[:, None]
        count = (z > 0).sum(1).to(losses.dtype)
        near_above = ((z > 0) & (z <= width[:, None])).sum(1).to(losses.dtype)
        near_below = ((z <= 0) & (z > -width[:, None])).sum(1).to(losses.dtype)
        excess = count - k
        near = torch.where(excess > 0, near_above, near_below)
        need, sign = excess.abs(), torch.where(excess > 0, 1.0, -1.0).to(losses.dtype)
        inside = near >= need
        moved = lam + sign * width * torch.where(inside, need / near.clamp(min=1), 1.0)
        target = max(WINDOW_LOSSES, n / WINDOW_SHARE)
        window = torch.where(inside, width * (target / near.clamp(min=1)).clamp(0.5, 2.0), 2.0 * width)
        moved, window = torch.where(excess == 0, lam, moved), torch.where(excess == 0, width, window)
        nxt = torch.minimum(torch.maximum(moved, least), most)
        window = torch.maximum(window, (most - least) / n)
        undefined = torch.isnan(losses).any(1)
        nan = float("nan")
        return torch.where(undefined, nan, nxt), torch.where(undefined, nan, window), torch.where(undefined, nan, count)


def relu_window(losses: torch.Tensor) -> torch.Tensor:
    """MATk's first tracking window per row of ``losses`` (P, n): the width that ``max(4, n/32)``
    evenly spaced losses of the row's finite range take, at most that range."""
    least, most = _finite_range(losses)
    n = losses.shape[1]
    return (most - least) * min(1.0, max(WINDOW_LOSSES, n / WINDOW_SHARE) / n)


def _finite_range(losses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the least and the largest finite loss (0 and 0 on a row without one)."""
    finite = torch.isfinite(losses)
    least = torch.where(finite, losses, torch.full_like(losses, float("inf"))).amin(1)
    most = torch.where(finite, losses, torch.full_like(losses, float("-inf"))).amax(1)
    return torch.where(finite.any(1), least, 0.0), torch.where(finite.any(1), most, 0.0)


def _bracket(losses: torch.Tensor, k: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, λ's bracket ``[min ℓ − δ√(n/(n−k)), max ℓ + δ√(n/(k − m))]`` over the finite losses,
    m the losses at +inf (see :func:`solve_srelu_threshold`)."""
    n = losses.shape[1]
    above = torch.isposinf(losses).sum(1)  # above every λ: each adds 1 to the count
    least, most = _finite_range(losses)
    low = least - delta * torch.sqrt(n / (n - k).clamp(min=0.5))
    high = most + delta * torch.sqrt(n / (k - above).clamp(min=0.5))
    return low, high


def _step_sums(
    losses: torch.Tensor, lam: torch.Tensor, delta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row at λ: the smoothed count ``Σ SReLU'(ℓ − λ)``, its curvature ``Σ SReLU''`` and that
    curvature's change in λ (:func:`curvature_change`), the sums a solve step reads."""
    z = losses - lam[:, None]
    slope, curvature = srelu_slope_and_curvature(z, delta[:, None])
    change = curvature_change(z, delta[:, None], curvature).sum(1)
    return slope.sum(1), curvature.sum(1), change


def curvature_change(z: torch.Tensor, delta: torch.Tensor, curvature: torch.Tensor) -> torch.Tensor:
    """``d/dλ`` of SReLU''(z) with ``z = ℓ − λ``, elementwise: ``3·SReLU''(z)·z/r²`` with
    ``r = √(z² + δ²)``, given ``curvature = SReLU''(z)`` (0 beyond :func:`beyond_square`)."""
    big = beyond_square(z.dtype)
    z = z.clamp(-big, big)
    return 3.0 * curvature * (z / (z * z + delta * delta))


def power_law_step(
    count: torch.Tensor, excess: torch.Tensor, k: torch.Tensor, n: int, bend: torch.Tensor, change: torch.Tensor
) -> torch.Tensor:
    """The step in λ towards ``count = k`` that is exact where the count's gap ``a`` (``n − count``
    below the root, ``count`` above it) is a power of the distance to some λ₀: ``a ∝ |λ − λ₀|^p``.

    p is read off the gap's first two derivatives, ``1/p = q = 1 − a·a''/a'²`` (``a' = ±bend``,
    ``a'' = ±change``), and Newton's step is taken on ``a^q``, which is linear in λ there:
    ``±(a/bend)·((target/a)^q − 1)/q``. q = 1 is Newton's step on the count (losses spread evenly
    around λ); q = −½ is SReLU's own tail law, ``1 − SReLU'(z) ≈ δ²/(4z²)``, where λ lies several δ
    outside a pile of near-equal losses, the count is nearly flat, and Newton's step overshoots the
    pile. q is clamped at −½ below: for the tail law itself any sum of such tails has q <= −½
    (Cauchy–Schwarz), and q far below −½ is read where losses beyond the pile add a near-constant
    to the gap; the clamped step is the shorter one. Above :data:`NEWTON_ABOVE` = ½ the step is
    Newton's: among the losses the q read is biased low by the nearest ones, and its step would
    stop short of a target far into the bulk (uniform losses that move by 100 δ per call stay in
    band on 0.86 of the calls without this rule, 0.94 with it:
    ``test_among_spread_losses_the_step_is_newtons``). Between −½ and ½ the step is the power
    law's, never longer than Newton's and in its direction, so it does not jump over a pile it
    cannot see. ``thresholded_cpu.cpp`` holds the same two limits. NaN or infinite where the gap or
    ``bend`` is 0; the solve then bisects.

    Examples
    --------
    >>> one = torch.ones(1, dtype=torch.float64)  # 100 equal losses at 0, δ = 1, λ 10δ below, k = 90
    >>> losses, lam, k = torch.zeros(1, 100, dtype=torch.float64), -10 * one, 90 * one
    >>> slope, curvature = srelu_slope_and_curvature(losses - lam[:, None], one[:, None])
    >>> count, bend = slope.sum(1), curvature.sum(1)
    >>> change = curvature_change(losses - lam[:, None], one[:, None], curvature).sum(1)
    >>> root, _ = solve_srelu_threshold(losses, k, one, lam, steps=50)
    >>> newton = lam + (count - k) / bend
    >>> ours = lam + power_law_step(count, count - k, k, 100, bend, change)
    >>> [round(float(x), 2) for x in (newton, ours, root)]
    [187.97, -1.47, -1.33]
    """
    below = excess > 0
    gap = torch.where(below, n - count, count)
    target = torch.where(below, n - k, k)
    sign = torch.where(below, 1.0, -1.0).to(count.dtype)
    q = 1.0 - sign * (gap / bend) * (change / bend)
    q = torch.where(q > NEWTON_ABOVE, 1.0, q.clamp(min=-0.5))
    log_ratio = torch.log(target / gap)
    x = q * log_ratio
    relative = torch.where(x.abs() < 1e-6, 1.0 + 0.5 * x, torch.expm1(x) / x)  # (e^x − 1)/x
    return sign * gap / bend * log_ratio * relative


def kth_largest_value(losses: torch.Tensor, k: int, by_topk: bool | None = None) -> torch.Tensor:
    """ℓ_[k] of ``losses`` along the last axis as ``losses.kthvalue(n + 1 − k, -1)`` gives it (NaN
    counts as the largest), by ``torch.topk`` of the shorter side (k or n + 1 − k) where ``by_topk``
    (default: on CUDA, whose ``kthvalue`` selects a long row in one thread block: 62 ms for 1e7
    losses on an H200, where topk takes 1–2 ms); the CPU's ``kthvalue`` is a linear-time selection
    already. 1-D losses give a 0-d tensor, (P, n) losses one value per row.

    Examples
    --------
    >>> x = torch.tensor([1.0, 5.0, 3.0, 0.0, 3.0])
    >>> [float(kth_largest_value(x, k, by_topk=True)) for k in range(1, 6)]
    [5.0, 3.0, 3.0, 1.0, 0.0]
    """
    n = losses.shape[-1]
    if not (losses.is_cuda if by_topk is None else by_topk):
        return losses.kthvalue(n + 1 - k, -1).values
    if k <= n + 1 - k:
        largest = losses.topk(k, sorted=False).values
        nan = largest.isnan()
        return torch.where(nan.all(-1), largest.amax(-1), torch.where(nan, float("inf"), largest).amin(-1))
    return losses.topk(n + 1 - k, largest=False, sorted=False).values.amax(-1)  # amax propagates NaN, the largest


def kth_largest(losses: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """ℓ_[k] of ``losses`` (1-D, or (P, n) per row; k a count in [1, n], or a (P,) tensor of counts,
    one per row): the root of MATk's equation where MATk equals (k/n)·ATk. An infinite ℓ_[k] is
    clamped to the finite losses' range, so that λ stays finite (MATk is then +inf with a +inf loss,
    as ATk is).

    Examples
    --------
    >>> kth_largest(torch.tensor([1.0, 5.0, 3.0, 0.0]), 2)
    tensor(3.)
    >>> kth_largest(torch.tensor([[1.0, 5.0, 3.0], [2.0, 0.0, 8.0]]), torch.tensor([3.0, 1.0]))
    tensor([1., 8.])
    """
    with torch.no_grad():
        if isinstance(k, torch.Tensor):  # per row: a sort, NaN first as kthvalue ranks it
            descending = losses.sort(dim=-1, descending=True).values
            value = descending.gather(-1, (k.long() - 1)[:, None]).squeeze(-1)
        else:
            value = kth_largest_value(losses, k)
        finite = torch.isfinite(losses)
        least = torch.where(finite, losses, torch.full_like(losses, float("inf"))).amin(-1)
        most = torch.where(finite, losses, torch.full_like(losses, float("-inf"))).amax(-1)
        return torch.where(finite.any(-1), value.clamp(least, most), value)
