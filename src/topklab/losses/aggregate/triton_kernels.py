"""The Triton kernels of :mod:`topklab.losses.aggregate.triton_pass` (imported on first use, so that
``TRITON_INTERPRET`` is read when they are defined)."""

import triton
import triton.language as tl

BIG = tl.constexpr(2.0**63)  # |ℓ − λ| beyond which SReLU's root is |ℓ − λ| in float32 (smoothing.beyond_square)
WINDOW_LOSSES = tl.constexpr(4.0)  # solve.py's MATk window (change one, change all)
WINDOW_SHARE = tl.constexpr(32.0)
INF = tl.constexpr(float("inf"))


@triton.jit
def power_law_step(count, excess, k, n, bend, change):
    below = excess > 0
    gap = tl.where(below, n - count, count)
    target = tl.where(below, n - k, k)
    sign = tl.where(below, 1.0, -1.0)
    q = 1.0 - sign * (gap / bend) * (change / bend)
    q = tl.where(q > 0.5, 1.0, tl.where(q < -0.5, -0.5, q))
    log_ratio = tl.log(target / gap)
    x = q * log_ratio
    # (e^x − 1)/x; its series where e^x − 1 would cancel (GPU exp is approximate)
    relative = tl.where(tl.abs(x) < 1e-2, 1.0 + x * (0.5 + x * (1.0 / 6.0 + x / 24.0)), (tl.exp(x) - 1.0) / x)
    return sign * gap / bend * log_ratio * relative


@triton.jit
def srelu_terms(x, dd):
    """Per loss at x = ℓ − λ (δ² = dd): (SReLU(x) + δ/2, SReLU'(x), SReLU''(x), d/dλ of SReLU''), x clamped
    to ±BIG as smoothing.py does (the root is |x| beyond), SReLU' in its accurate form δ²/(2r(r − x)) below 0."""
    # selects, not tl.maximum/tl.minimum: on CUDA those drop a NaN operand, and a NaN loss must stay NaN
    low = tl.where(x < -BIG, -BIG, x)
    bounded = tl.where(low > BIG, BIG, low)
    bounded_root = tl.sqrt(bounded * bounded + dd)
    root = tl.where(bounded_root < tl.abs(low), tl.abs(low), bounded_root)
    span = bounded_root - tl.where(bounded < 0, bounded, 0.0)
    slope = tl.where(bounded < 0, dd / (bounded_root * span), 1.0 + bounded / bounded_root) * 0.5
    bend = 0.5 * dd / (bounded_root * bounded_root * bounded_root)
    return 0.5 * low + 0.5 * root, slope, bend, 3.0 * bend * (bounded / (bounded * bounded + dd))


@triton.jit
def tracked_row_kernel(
    losses_ptr, grad_ptr, value_ptr, lam_ptr, lam_last_ptr, width_ptr, state_ptr, work_ptr, ticket_ptr,
    n, k, delta, scale, momentum, burn_in, iters,
    RELU: tl.constexpr, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    row = tl.program_id(1)
    rows = tl.num_programs(1)
    losses_ptr += row.to(tl.int64) * n  # rows × n may pass 2³¹
    grad_ptr += row.to(tl.int64) * n
    lam_ptr += row
    lam_last_ptr += row
    lam = tl.load(lam_last_ptr).to(tl.float32)
    if RELU:
        width_ptr += row
    width = tl.load(width_ptr).to(tl.float32) if RELU else 0.0
    step = scale / n
    dd = delta * delta
    phi_sum = tl.zeros((BLOCK,), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    second = tl.zeros((BLOCK,), tl.float32)
    third = tl.zeros((BLOCK,), tl.float32)
    least = tl.full((BLOCK,), INF, tl.float32)
    most = tl.full((BLOCK,), -INF, tl.float32)
    infs = tl.zeros((BLOCK,), tl.float32)
    for it in range(iters):
        offs = (pid * iters + it) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        v = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        x = v - lam
        if RELU:
            phi = tl.where(x <= 0, 0.0, x)
            up = tl.where(x > 0, 1.0, 0.0)
            slope = up
            grad = up * step
            second += tl.where(inside & (x > 0) & (x <= width), 1.0, 0.0)
            third += tl.where(inside & (x <= 0) & (x > -width), 1.0, 0.0)
        else:
            phi, slope, bend, change = srelu_terms(x, dd)
            grad = slope * step
            second += tl.where(inside, bend, 0.0)
            third += tl.where(inside, change, 0.0)
        tl.store(grad_ptr + offs, grad.to(grad_ptr.dtype.element_ty), mask=inside)
        phi_sum += tl.where(inside, phi, 0.0)
        count += tl.where(inside, slope, 0.0)
        finite = inside & (tl.abs(v) < INF)
        least = tl.minimum(least, tl.where(finite, v, INF))
        most = tl.maximum(most, tl.where(finite, v, -INF))
        infs += tl.where(inside & (v == INF), 1.0, 0.0)
    part = work_ptr + (row * programs + pid) * 8
    tl.store(part + 0, tl.sum(phi_sum, 0))
    tl.store(part + 1, tl.sum(count, 0))
    tl.store(part + 2, tl.sum(second, 0))
    tl.store(part + 3, tl.sum(third, 0))
    tl.store(part + 4, tl.min(least, 0))
    tl.store(part + 5, tl.max(most, 0))
    tl.store(part + 6, tl.sum(infs, 0))
    tl.debug_barrier()  # every thread's writes before the ticket (it is taken by one thread)
    ticket = tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel")
    if ticket == programs - 1:  # the row's last program: combine in program order, in float64
        slots = tl.arange(0, PROGRAMS)
        mine = slots < programs
        parts = work_ptr + (row * programs + slots) * 8
        phi_all = tl.sum(tl.load(parts + 0, mask=mine, other=0.0).to(tl.float64), 0)
        count_all = tl.sum(tl.load(parts + 1, mask=mine, other=0.0).to(tl.float64), 0)
        second_all = tl.sum(tl.load(parts + 2, mask=mine, other=0.0).to(tl.float64), 0)
        third_all = tl.sum(tl.load(parts + 3, mask=mine, other=0.0).to(tl.float64), 0)
        lo = tl.min(tl.load(parts + 4, mask=mine, other=INF), 0).to(tl.float64)
        hi = tl.max(tl.load(parts + 5, mask=mine, other=-INF), 0).to(tl.float64)
        above = tl.sum(tl.load(parts + 6, mask=mine, other=0.0).to(tl.float64), 0)
        nn = tl.cast(n, tl.float64)
        lam64 = lam.to(tl.float64)
        kk = tl.cast(k, tl.float64)
        d = delta * 1.0
        hinge = phi_all / nn
        if not RELU:
            hinge = hinge - 0.5 * d
        value = (hinge + kk / nn * lam64) * scale
        tl.store(value_ptr + row, value.to(tl.float32).to(value_ptr.dtype.element_ty))
        empty = lo > hi
        lo = tl.where(empty, 0.0, lo)
        hi = tl.where(empty, 0.0, hi)
        excess = count_all - kk
        if RELU:
            w = width.to(tl.float64)
            near = tl.where(excess > 0, second_all, third_all)
            need = tl.abs(excess)
            sign = tl.where(excess > 0, 1.0, -1.0)
            inside_w = near >= need
            target = tl.maximum(WINDOW_LOSSES, nn / WINDOW_SHARE)
            moved = tl.where(inside_w, lam64 + sign * w * (need / tl.maximum(near, 1.0)), lam64 + sign * w)
            ratio = tl.minimum(2.0, tl.maximum(0.5, target / tl.maximum(near, 1.0)))
            window = tl.where(inside_w, w * ratio, 2.0 * w)
            moved = tl.where(excess == 0, lam64, moved)
            window = tl.where(excess == 0, w, window)
            nxt = tl.where(moved < lo, lo, tl.where(moved > hi, hi, moved))  # a NaN stays NaN (not stored)
            window = tl.maximum(window, (hi - lo) / nn)
        else:
            lower_gap = tl.maximum(nn - kk, 0.5)
            upper_gap = tl.maximum(kk - above, 0.5)
            low_end = lo - d * tl.sqrt(nn / lower_gap)
            high_end = hi + d * tl.sqrt(nn / upper_gap)
            low_end = tl.where(excess > 0, tl.maximum(low_end, lam64), low_end)
            high_end = tl.where(excess > 0, high_end, tl.minimum(high_end, lam64))
            proposal = lam64 + power_law_step(count_all, excess, kk, nn, second_all, third_all)
            size = tl.abs(lam)
            resolution = ((size.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True) - size).to(tl.float64)
            proposal32 = proposal.to(tl.float32).to(tl.float64)
            kept = (proposal32 == lam64) & (d >= resolution)
            within = (proposal > low_end) & (proposal < high_end)
            nxt = tl.where(kept | within, proposal, 0.5 * (low_end + high_end))
            nxt = tl.where(excess == 0, lam64, nxt)
            window = 0.0
        defined = phi_all == phi_all  # a NaN loss: no step, λ stays
        nxt32 = nxt.to(tl.float32)
        store = defined & (tl.abs(nxt32) < INF)
        average = tl.load(lam_ptr)
        tl.store(lam_last_ptr, tl.where(store, nxt32, lam))
        new_average = (1.0 - momentum) * average + momentum * nxt32
        tl.store(lam_ptr, tl.where(store, new_average.to(tl.float32), average))
        if RELU:
            window32 = window.to(tl.float32)
            tl.store(width_ptr, tl.where(store & (tl.abs(window32) < INF), window32, width))
        share = tl.where(defined, count_all / nn, phi_all)  # phi_all is NaN where not defined
        tl.atomic_xchg(ticket_ptr + row, 0)
        record_rows(
            state_ptr, work_ptr, ticket_ptr, lam_ptr, lam_last_ptr, row, rows, share, lam, kk, nn, burn_in, momentum,
            SHARED=False, PROGRAMS=PROGRAMS,
        )  # fmt: skip


@triton.jit
def scale_kernel(grad_ptr, out_ptr, incoming_ptr, n, total, BLOCK: tl.constexpr):
    """``out`` = ``grad`` (rows of n) × each row's incoming gradient (contiguous, one a row); ``grad``,
    saved for the backward, is left as it is, so that a second backward through the call reads it again."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    values = tl.load(grad_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    if n == total:
        g = tl.load(incoming_ptr).to(tl.float32)
        tl.store(out_ptr + offs, (values * g).to(out_ptr.dtype.element_ty), mask=inside)
    else:
        row_g = tl.load(incoming_ptr + offs // n, mask=inside, other=1.0).to(tl.float32)
        tl.store(out_ptr + offs, (values * row_g).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def in_band(share, target):
    """lambda_monitor.in_band: the share within a factor 2 of k/n, its complement within one of 1 − k/n."""
    below = 1.0 - share
    return (share <= 2 * target) & (share >= target / 2) & (below <= 2 * (1.0 - target)) & (below >= (1.0 - target) / 2)


@triton.jit
def record_call(state_ptr, share, kk, nn, burn_in):
    """The λ monitor's record() of one call on one row: ``share`` judged against k/n."""
    record_judged(state_ptr, share, in_band(share, kk / nn) & (kk < nn), kk < nn, burn_in)


@triton.jit
def record_judged(state_ptr, share, good, banded, burn_in):
    """The λ monitor's record() of one call (lambda_monitor.py), in band where ``good``: [calls, share_sum,
    in_band_all, counted, in_band, 3 sampled sums, seen, streak]."""
    seen = tl.load(state_ptr + 8)
    streak = tl.load(state_ptr + 9)
    hit = tl.where(good, 1.0, 0.0)
    counted = tl.where(banded & (seen + 1.0 > burn_in), 1.0, 0.0)
    kept_streak = tl.where(banded, 1.0 - hit, 0.0)
    tl.store(state_ptr + 0, tl.load(state_ptr + 0) + 1.0)
    tl.store(state_ptr + 1, tl.load(state_ptr + 1) + share)
    tl.store(state_ptr + 2, tl.load(state_ptr + 2) + hit)
    tl.store(state_ptr + 3, tl.load(state_ptr + 3) + counted)
    tl.store(state_ptr + 4, tl.load(state_ptr + 4) + hit * counted)
    tl.store(state_ptr + 8, seen + 1.0)
    tl.store(state_ptr + 9, tl.where(banded, streak * kept_streak + kept_streak, streak))


@triton.jit
def record_rows(
    state_ptr, work_ptr, ticket_ptr, lam_ptr, lam_last_ptr, row, rows, share, lam, kk, nn, burn_in, momentum,
    SHARED: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    """A row's share and λ from its last program; the last row to finish (a second ticket) records the
    call: the rows' mean share, in band where every row is (LambdaMonitor.rows_in_band), and where the
    rows share one stored λ (``SHARED``), stores the mean of their finite λ and its running average
    (LambdaRule.store). ``work``: the rows' shares from slot 8·PROGRAMS, their λ from 9·PROGRAMS;
    ``ticket``: the rows' one at PROGRAMS."""
    tl.store(work_ptr + PROGRAMS * 8 + row, share)
    tl.store(work_ptr + PROGRAMS * 9 + row, lam)
    tl.debug_barrier()
    last = tl.atomic_add(ticket_ptr + PROGRAMS, 1, sem="acq_rel")
    if last == rows - 1:
        slots = tl.arange(0, PROGRAMS)
        mine = slots < rows
        shares = tl.load(work_ptr + PROGRAMS * 8 + slots, mask=mine, other=0.0).to(tl.float64)
        target = kk / nn
        every = tl.min(tl.where(mine, in_band(shares, target).to(tl.int32), 1), 0) == 1
        mean = tl.where(rows == 1, share, tl.sum(shares, 0) / rows)
        good = tl.where(rows == 1, in_band(share, target), every) & (kk < nn)
        record_judged(state_ptr, mean, good, kk < nn, burn_in)
        if SHARED:
            lams = tl.load(work_ptr + PROGRAMS * 9 + slots, mask=mine, other=0.0)
            finite = mine & (tl.abs(lams) < INF)
            found = tl.sum(tl.where(finite, 1.0, 0.0), 0)
            root = (tl.sum(tl.where(finite, lams, 0.0), 0) / tl.maximum(found, 1.0)).to(tl.float32)
            average = tl.load(lam_ptr)
            tl.store(lam_last_ptr, tl.where(found > 0, root, tl.load(lam_last_ptr)))
            new_average = ((1.0 - momentum) * average + momentum * root).to(tl.float32)
            tl.store(lam_ptr, tl.where(found > 0, new_average, average))
        tl.atomic_xchg(ticket_ptr + PROGRAMS, 0)


@triton.jit
def solved_row_kernel(
    losses_ptr, grad_ptr, value_ptr, lam_ptr, lam_last_ptr, state_ptr, work_ptr, ticket_ptr,
    n, k, delta, scale, momentum, burn_in, steps,
    RELU: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    """A solved training call on rows held on chip (one program a row, n <= BLOCK): λ the row's root
    (STk: `steps` safeguarded steps from its stored λ, or from its own k-th largest loss where the rows
    share one (``SHARED``), the best iterate, as solve.py's solve_srelu_threshold; MATk: the exact k-th
    largest loss, the tied losses sharing the missing gradient mass), then the value and the gradient
    at λ, the stored λ (each row's, or the rows' mean: :func:`record_rows`) and the monitor's sums."""
    row = tl.program_id(0)
    rows = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    losses_ptr += row.to(tl.int64) * n  # rows × n may pass 2³¹
    grad_ptr += row.to(tl.int64) * n
    if not SHARED:
        lam_ptr += row
        lam_last_ptr += row
    v = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    finite = inside & (tl.abs(v) < INF)
    any_finite = tl.sum(tl.where(finite, 1.0, 0.0), 0) > 0
    least = tl.where(any_finite, tl.min(tl.where(finite, v, INF), 0), 0.0)
    most = tl.where(any_finite, tl.max(tl.where(finite, v, -INF), 0), 0.0)
    undefined = tl.sum(tl.where(inside & (v != v), 1.0, 0.0), 0) > 0
    nn = n * 1.0
    kk = k * 1.0
    d = delta * 1.0
    dd = d * d
    step = scale / n
    if RELU:
        ordered = tl.sort(tl.where(inside & (v == v), v, -INF), 0, descending=True)
        kth = tl.sum(tl.where(offs == k - 1, ordered, 0.0), 0)
        lam = tl.where(kth < least, least, tl.where(kth > most, most, kth))
        x = v - lam
        grad = tl.where(x > 0, step, 0.0)
        above = tl.sum(tl.where(inside & (x > 0), 1.0, 0.0), 0)
        ties = tl.sum(tl.where(inside & (x == 0), 1.0, 0.0), 0)
        grad = tl.where(inside & (x == 0), step * ((kk - above) / tl.maximum(ties, 1.0)), grad)
        phi = tl.where(x <= 0, 0.0, x)
        hinge = tl.sum(tl.where(inside, phi, 0.0), 0) / nn
        share = tl.minimum(above + ties, kk) / nn
    else:
        above_all = tl.sum(tl.where(inside & (v == INF), 1.0, 0.0), 0)
        low = least - d * tl.sqrt(nn / tl.maximum(nn - kk, 0.5))
        high = most + d * tl.sqrt(nn / tl.maximum(kk - above_all, 0.5))
        if SHARED:  # from the row's own k-th largest loss (solve.kth_largest), not one warm start
            ordered = tl.sort(tl.where(inside & (v == v), v, -INF), 0, descending=True)
            kth = tl.sum(tl.where(offs == k - 1, ordered, 0.0), 0)
            start = tl.where(any_finite, tl.where(kth < least, least, tl.where(kth > most, most, kth)), kth)
        else:
            start = tl.load(lam_last_ptr).to(tl.float32)
        lam = tl.where(start < low, low, tl.where(start > high, high, start))
        best = lam
        best_excess = INF
        best_count = nn
        for _ in range(steps + 1):
            _, slope, curvature, curvature_change = srelu_terms(v - lam, dd)
            count = tl.sum(tl.where(inside, slope, 0.0), 0)
            bend = tl.sum(tl.where(inside, curvature, 0.0), 0)
            change = tl.sum(tl.where(inside, curvature_change, 0.0), 0)
            excess = count - kk
            better = tl.abs(excess) < best_excess
            best = tl.where(better, lam, best)
            best_excess = tl.where(better, tl.abs(excess), best_excess)
            best_count = tl.where(better, count, best_count)
            low = tl.where(excess > 0, lam, low)
            high = tl.where(excess > 0, high, lam)
            proposal = lam + power_law_step(count, excess, kk, nn, bend, change)
            lam = tl.where((proposal > low) & (proposal < high), proposal, 0.5 * (low + high))
        lam = best
        phi, slope, _, _ = srelu_terms(v - lam, dd)
        grad = slope * step
        hinge = tl.sum(tl.where(inside, phi, 0.0), 0) / nn - 0.5 * d
        share = best_count / nn
    share = tl.where(undefined, hinge, share)  # NaN: hinge sums the NaN loss
    value = (hinge + kk / nn * lam) * scale
    tl.store(grad_ptr + offs, grad.to(grad_ptr.dtype.element_ty), mask=inside)
    tl.store(value_ptr + row, value.to(tl.float32).to(value_ptr.dtype.element_ty))
    if not SHARED:
        store = (~undefined) & (tl.abs(lam) < INF)
        average = tl.load(lam_ptr)
        tl.store(lam_last_ptr, tl.where(store, lam, tl.load(lam_last_ptr)))
        tl.store(lam_ptr, tl.where(store, ((1.0 - momentum) * average + momentum * lam).to(tl.float32), average))
    record_rows(
        state_ptr, work_ptr, ticket_ptr, lam_ptr, lam_last_ptr, row, rows, share, tl.where(undefined, hinge, lam),
        kk, nn, burn_in, momentum, SHARED=SHARED, PROGRAMS=PROGRAMS,
    )  # fmt: skip


@triton.jit
def combined(work_ptr, slot, programs, PROGRAMS: tl.constexpr):
    """The float64 sum of the programs' partials in ``slot``, in program order."""
    slots = tl.arange(0, PROGRAMS)
    return tl.sum(tl.load(work_ptr + slots * 8 + slot, mask=slots < programs, other=0.0).to(tl.float64), 0)


@triton.jit
def combined_range(work_ptr, programs, PROGRAMS: tl.constexpr):
    """(least, most) of the programs' finite losses (slots 4 and 5), (0, 0) where there is none."""
    slots = tl.arange(0, PROGRAMS)
    mine = slots < programs
    lo = tl.min(tl.load(work_ptr + slots * 8 + 4, mask=mine, other=INF), 0).to(tl.float64)
    hi = tl.max(tl.load(work_ptr + slots * 8 + 5, mask=mine, other=-INF), 0).to(tl.float64)
    empty = lo > hi
    return tl.where(empty, 0.0, lo), tl.where(empty, 0.0, hi), empty


@triton.jit
def solve_pass_kernel(
    losses_ptr, lam_ptr, lam_last_ptr, state_ptr, work_ptr, ticket_ptr, solve_ptr, used_ptr, value_ptr,
    n, k, delta, scale, momentum, burn_in, iters,
    FIRST: tl.constexpr, LAST: tl.constexpr, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    """One step of STk's solve on a long row (solve.py's solve_srelu_threshold, one launch a step): every
    program sums SReLU's terms at the step's λ over its blocks; the last to finish combines them in
    program order in float64, keeps the best iterate and takes the safeguarded step. The first launch
    also finds the bracket (and λ's warm start clamped into it; an evaluation outside it does not
    count); the last writes the value at the best iterate, the stored λ, its average and the monitor's
    sums, and the best λ for the backward (``used``). ``solve``: float64 [λ, low, high, best, |excess|,
    count, Σφ, NaN count] between launches."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if FIRST:
        lam = tl.load(lam_last_ptr).to(tl.float32)
    else:
        lam = tl.load(solve_ptr).to(tl.float32)
    dd = delta * delta
    phi_sum = tl.zeros((BLOCK,), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    bend = tl.zeros((BLOCK,), tl.float32)
    change = tl.zeros((BLOCK,), tl.float32)
    least = tl.full((BLOCK,), INF, tl.float32)
    most = tl.full((BLOCK,), -INF, tl.float32)
    infs = tl.zeros((BLOCK,), tl.float32)
    nans = tl.zeros((BLOCK,), tl.float32)
    for it in range(iters):
        offs = (pid * iters + it) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        v = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        phi, slope, curvature, curvature_change = srelu_terms(v - lam, dd)
        phi_sum += tl.where(inside, phi, 0.0)
        count += tl.where(inside, slope, 0.0)
        bend += tl.where(inside, curvature, 0.0)
        change += tl.where(inside, curvature_change, 0.0)
        if FIRST:
            finite = inside & (tl.abs(v) < INF)
            least = tl.minimum(least, tl.where(finite, v, INF))
            most = tl.maximum(most, tl.where(finite, v, -INF))
            infs += tl.where(inside & (v == INF), 1.0, 0.0)
            nans += tl.where(inside & (v != v), 1.0, 0.0)
    row = work_ptr + pid * 8
    tl.store(row + 0, tl.sum(phi_sum, 0))
    tl.store(row + 1, tl.sum(count, 0))
    tl.store(row + 2, tl.sum(bend, 0))
    tl.store(row + 3, tl.sum(change, 0))
    if FIRST:
        tl.store(row + 4, tl.min(least, 0))
        tl.store(row + 5, tl.max(most, 0))
        tl.store(row + 6, tl.sum(infs, 0))
        tl.store(row + 7, tl.sum(nans, 0))
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == programs - 1:
        phi_all = combined(work_ptr, 0, programs, PROGRAMS)
        count_all = combined(work_ptr, 1, programs, PROGRAMS)
        bend_all = combined(work_ptr, 2, programs, PROGRAMS)
        change_all = combined(work_ptr, 3, programs, PROGRAMS)
        nn = tl.cast(n, tl.float64)
        kk = tl.cast(k, tl.float64)
        d = tl.cast(delta, tl.float64)
        lam64 = lam.to(tl.float64)
        if FIRST:
            lo, hi, _ = combined_range(work_ptr, programs, PROGRAMS)
            above = combined(work_ptr, 6, programs, PROGRAMS)
            low = lo - d * tl.sqrt(nn / tl.maximum(nn - kk, 0.5))
            high = hi + d * tl.sqrt(nn / tl.maximum(kk - above, 0.5))
            start = tl.where(lam64 < low, low, tl.where(lam64 > high, high, lam64)).to(tl.float32).to(tl.float64)
            evaluated = start == lam64
            best = start
            best_excess = nn * INF
            best_count = nn
            best_phi = nn * 0.0
            undefined = combined(work_ptr, 7, programs, PROGRAMS)
        else:
            evaluated = lam64 == lam64
            start = lam64
            low = tl.load(solve_ptr + 1)
            high = tl.load(solve_ptr + 2)
            best = tl.load(solve_ptr + 3)
            best_excess = tl.load(solve_ptr + 4)
            best_count = tl.load(solve_ptr + 5)
            best_phi = tl.load(solve_ptr + 6)
            undefined = tl.load(solve_ptr + 7)
        excess = count_all - kk
        better = evaluated & (tl.abs(excess) < best_excess)
        best = tl.where(better, lam64, best)
        best_excess = tl.where(better, tl.abs(excess), best_excess)
        best_count = tl.where(better, count_all, best_count)
        best_phi = tl.where(better, phi_all, best_phi)
        low = tl.where(evaluated & (excess > 0), lam64, low)
        high = tl.where(evaluated & (excess <= 0), lam64, high)
        proposal = lam64 + power_law_step(count_all, excess, kk, nn, bend_all, change_all)
        stepped = tl.where((proposal > low) & (proposal < high), proposal, 0.5 * (low + high))
        if LAST:
            defined = undefined == 0
            value = ((best_phi / nn - 0.5 * d) + kk / nn * best) * scale
            value = tl.where(defined, value, phi_all)  # phi_all is NaN where a loss is
            tl.store(value_ptr, value.to(tl.float32).to(value_ptr.dtype.element_ty))
            best32 = best.to(tl.float32)
            tl.store(used_ptr, tl.where(defined, best32, phi_all.to(tl.float32)))
            store = defined & (tl.abs(best32) < INF)
            average = tl.load(lam_ptr)
            tl.store(lam_last_ptr, tl.where(store, best32, tl.load(lam_last_ptr)))
            new_average = ((1.0 - momentum) * average + momentum * best32).to(tl.float32)
            tl.store(lam_ptr, tl.where(store, new_average, average))
            record_call(state_ptr, tl.where(defined, best_count / nn, phi_all), kk, nn, burn_in)
        else:
            tl.store(solve_ptr + 0, tl.where(evaluated, stepped, start))
            tl.store(solve_ptr + 1, low)
            tl.store(solve_ptr + 2, high)
            tl.store(solve_ptr + 3, best)
            tl.store(solve_ptr + 4, best_excess)
            tl.store(solve_ptr + 5, best_count)
            tl.store(solve_ptr + 6, best_phi)
            tl.store(solve_ptr + 7, undefined)
        tl.atomic_xchg(ticket_ptr, 0)


BINS = tl.constexpr(65536)  # the histogram of 16 bits of a float32's ordered key
SCAN = tl.constexpr(1024)  # bins a scan step reads


@triton.jit
def ordered_key(v):
    """float32 → int32 keys in the floats' order (−0 as +0; the negatives' 31 low bits flipped)."""
    bits = (v + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def from_key(key):
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def kth_bin(bins_ptr, need):
    """(the bin, counted from the top, in which the count reaches ``need``, the count in the bins above
    it), scanning the histogram from its top bin down and zeroing it for the next call."""
    lanes = tl.arange(0, SCAN)
    need = tl.cast(need, tl.float64)
    running = need * 0.0
    before = need * 0.0
    chosen = running.to(tl.int32)
    found = chosen * 0
    for chunk in range(BINS // SCAN):
        index = BINS - 1 - (chunk * SCAN + lanes)
        counts = tl.load(bins_ptr + index)
        tl.store(bins_ptr + index, tl.zeros((SCAN,), tl.int32))
        reached = tl.cumsum(counts, 0).to(tl.float64) + running
        first = tl.min(tl.where(reached >= need, lanes, SCAN), 0)
        hit = (first < SCAN) & (found == 0)
        chosen = tl.where(hit, BINS - 1 - (chunk * SCAN + first), chosen)
        before = tl.where(hit, tl.sum(tl.where(lanes < first, counts, 0), 0).to(tl.float64) + running, before)
        found = tl.where(hit, 1, found)
        running += tl.sum(counts, 0).to(tl.float64)
    return chosen, before


@triton.jit
def select_pass_kernel(
    losses_ptr, bins_ptr, work_ptr, ticket_ptr, solve_ptr, n, k, iters,
    LOW: tl.constexpr, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    """One of the two counting passes of MATk's k-th largest loss on a long row (a radix select on the
    losses' ordered keys, integer counts only): the first counts the keys' high 16 bits (and the
    finite range and NaNs); the last program finds the bin holding the k-th largest. The second counts
    the low 16 bits within that bin; its last program assembles ℓ_[k], clamped to the finite range as
    solve.py's kth_largest does. ``solve``: float64 [λ, bin, count above the bin, NaN count]."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if LOW:
        high_bin = tl.load(solve_ptr + 1).to(tl.int32)
    least = tl.full((BLOCK,), INF, tl.float32)
    most = tl.full((BLOCK,), -INF, tl.float32)
    nans = tl.zeros((BLOCK,), tl.float32)
    for it in range(iters):
        offs = (pid * iters + it) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        v = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        key = ordered_key(v)
        counted = inside & (v == v)
        if LOW:
            tl.atomic_add(bins_ptr + (key & 0xFFFF), 1, mask=counted & ((key >> 16) + 32768 == high_bin))
        else:
            tl.atomic_add(bins_ptr + ((key >> 16) + 32768), 1, mask=counted)
            finite = inside & (tl.abs(v) < INF)
            least = tl.minimum(least, tl.where(finite, v, INF))
            most = tl.maximum(most, tl.where(finite, v, -INF))
            nans += tl.where(inside & (v != v), 1.0, 0.0)
    if not LOW:
        row = work_ptr + pid * 8
        tl.store(row + 4, tl.min(least, 0))
        tl.store(row + 5, tl.max(most, 0))
        tl.store(row + 7, tl.sum(nans, 0))
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == programs - 1:
        if LOW:
            low_bin, _ = kth_bin(bins_ptr, k - tl.load(solve_ptr + 2))
            kth = from_key(((high_bin - 32768) << 16) | low_bin).to(tl.float64)
            lo = tl.load(solve_ptr + 4)
            hi = tl.load(solve_ptr + 5)
            clamped = tl.where(kth < lo, lo, tl.where(kth > hi, hi, kth))
            tl.store(solve_ptr, tl.where(tl.load(solve_ptr + 6) == 0, clamped, kth))
        else:
            high_bin, above = kth_bin(bins_ptr, k)
            lo, hi, empty = combined_range(work_ptr, programs, PROGRAMS)
            tl.store(solve_ptr + 1, high_bin.to(tl.float64))
            tl.store(solve_ptr + 2, above.to(tl.float64))
            tl.store(solve_ptr + 3, combined(work_ptr, 7, programs, PROGRAMS))
            tl.store(solve_ptr + 4, lo)
            tl.store(solve_ptr + 5, hi)
            tl.store(solve_ptr + 6, tl.where(empty, 1.0, 0.0).to(tl.float64))
        tl.atomic_xchg(ticket_ptr, 0)


@triton.jit
def relu_value_kernel(
    losses_ptr, lam_ptr, lam_last_ptr, state_ptr, work_ptr, ticket_ptr, solve_ptr, used_ptr, value_ptr,
    n, k, scale, momentum, burn_in, iters,
    BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):  # fmt: skip
    """MATk's value at the selected ℓ_[k] on a long row: Σ(ℓ − λ)₊, the losses above λ and those at it;
    the last program writes the value, the tied losses' share of the missing gradient mass
    (``used``: [λ, (k − above)/ties]), the stored λ, its average and the monitor's sums."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    lam = tl.load(solve_ptr).to(tl.float32)
    phi_sum = tl.zeros((BLOCK,), tl.float32)
    above = tl.zeros((BLOCK,), tl.float32)
    ties = tl.zeros((BLOCK,), tl.float32)
    for it in range(iters):
        offs = (pid * iters + it) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32) - lam
        phi_sum += tl.where(inside, tl.where(x <= 0, 0.0, x), 0.0)
        above += tl.where(inside & (x > 0), 1.0, 0.0)
        ties += tl.where(inside & (x == 0), 1.0, 0.0)
    row = work_ptr + pid * 8
    tl.store(row + 0, tl.sum(phi_sum, 0))
    tl.store(row + 1, tl.sum(above, 0))
    tl.store(row + 2, tl.sum(ties, 0))
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == programs - 1:
        phi_all = combined(work_ptr, 0, programs, PROGRAMS)
        above_all = combined(work_ptr, 1, programs, PROGRAMS)
        ties_all = combined(work_ptr, 2, programs, PROGRAMS)
        nn = tl.cast(n, tl.float64)
        kk = tl.cast(k, tl.float64)
        defined = tl.load(solve_ptr + 3) == 0
        value = (phi_all / nn + kk / nn * lam.to(tl.float64)) * scale
        value = tl.where(defined, value, phi_all)  # phi_all is NaN where a loss is
        tl.store(value_ptr, value.to(tl.float32).to(value_ptr.dtype.element_ty))
        tl.store(used_ptr, lam)
        tl.store(used_ptr + 1, ((kk - above_all) / tl.maximum(ties_all, 1.0)).to(tl.float32))
        store = defined & (tl.abs(lam) < INF)
        average = tl.load(lam_ptr)
        tl.store(lam_last_ptr, tl.where(store, lam, tl.load(lam_last_ptr)))
        tl.store(lam_ptr, tl.where(store, ((1.0 - momentum) * average + momentum * lam).to(tl.float32), average))
        share = tl.where(defined, tl.minimum(above_all + ties_all, kk) / nn, phi_all)
        record_call(state_ptr, share, kk, nn, burn_in)
        tl.atomic_xchg(ticket_ptr, 0)


@triton.jit
def threshold_gradient_kernel(
    losses_ptr, grad_ptr, used_ptr, incoming_ptr, n, delta, step, RELU: tl.constexpr, BLOCK: tl.constexpr
):
    """The backward of a long solved row, recomputed from the losses at the λ the call used: the incoming
    gradient × (s/n)·φ'(ℓ − λ) (MATk: the tied losses' share from ``used``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    factor = tl.load(incoming_ptr).to(tl.float32) * step
    x = tl.load(losses_ptr + offs, mask=inside, other=0.0).to(tl.float32) - tl.load(used_ptr)
    if RELU:
        slope = tl.where(x > 0, 1.0, tl.where(x == 0, tl.load(used_ptr + 1), 0.0))
    else:
        _, slope, _, _ = srelu_terms(x, delta * delta)
    tl.store(grad_ptr + offs, (slope * factor).to(grad_ptr.dtype.element_ty), mask=inside)
