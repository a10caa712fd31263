"""SparseTopK: the p-norm regularised top-k mask of Sander et al. (ICML 2023), exact 0s and 1s.

The hard top-k mask is the linear program ``argmax_{μ ∈ P(w)} ⟨μ, x⟩`` over the permutahedron P(w),
the convex hull of the permutations of ``w = (1, …, 1, 0, …, 0)`` (k ones), which for this binary
w is the capped simplex ``{μ ∈ [0, 1]^n : Σμ = k}``. Sander et al. smooth it with a p-norm::

    mask(x) = argmax_{μ ∈ P(w)} ⟨μ, x⟩ − (ℓ/p)·Σ|μ_i|^p

and reduce it to one isotonic (non-increasing) optimisation on the sorted scores. Written in
``t = s/ℓ``, the scores sorted in descending order and divided by ℓ, with ``q = p/(p − 1)``::

    v = argmin_{v_1 >= … >= v_n} (1/q)·Σ|t_i − v_i|^q + ⟨w, v⟩,      mask_sorted = (t − v)^(q − 1)

p = 2 (q = 2): ``v`` is the isotonic regression of ``t − w`` and the mask is ``t − v``, the
Euclidean projection of x/ℓ onto P(w), i.e. ``clip(x/ℓ − τ, 0, 1)`` with Σ = k. p = 4/3 (q = 4):
each pooled block's value solves the cubic ``Σ_B (t_i − γ)^3 = Σ_B w_i``, and the mask is
``(t − v)^3``, a continuously differentiable operator (p = 2 has kinks where an item enters or
leaves the pooled block).

Two solvers of the isotonic problem: ``"pav"`` (pool adjacent violators, exact, on the CPU; p = 2
and p = 4/3) and ``"dykstra"`` (Sander et al.'s GPU-friendly alternating projections onto the
even-pair and the odd-pair constraints, batched in torch; p = 2 only). PAV has two kernels: the C++
one of ``pav_cpu.cpp``, prebuilt with the package (else built on first use, which needs a C++
compiler and ninja: :mod:`topklab.utils.native`), which for float32 and float64 scores also computes the squeeze
(:func:`_compress`), the mask and its backward (:class:`_SortedMask`), every row in one call; and
the Python reference, the torch operations below with a PAV loop per row, which is the fallback
where nothing can be built. Both give the same masks and gradients, bit for bit (tested).
"""

from __future__ import annotations

import math
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import torch

from topklab.operators.base import TopKOperator, positive
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError, first_line
from topklab.utils.native import load_native

SOLVERS = ("pav", "dykstra")
KERNELS = ("auto", "native", "python")
NATIVE_SOURCE = Path(__file__).with_name("pav_cpu.cpp")
_NATIVE_FAILURE: dict[str, str] = {}  # "pav" -> why the C++ PAV could not be built in this process
CUT = 4.0  # |t| beyond 1 (the k-th largest at t = 0) is never pooled: p and its gradient do not see _compress


def _compress(t: torch.Tensor) -> torch.Tensor:
    """t on [−CUT, CUT] and ``±(CUT + log(1 + |t| − CUT))`` beyond, in value (order and ties kept, so
    PAV pools exactly the same items); an overflowed ±inf ends at ±(CUT + 1000). The gradient is t's
    own (no gradient where t overflowed): the mask does not change, and items beyond ±CUT only ever
    get a gradient where ties among themselves are pooled, which stays as it was without the squeeze."""
    finite = torch.isfinite(t)
    safe = torch.where(finite, t, 0.0)
    beyond = safe.abs().clamp(min=CUT) - CUT
    squeezed = torch.where(beyond > 0, torch.sign(safe) * (CUT + torch.log1p(beyond)), safe)
    squeezed = torch.where(finite, squeezed, torch.sign(t) * (CUT + 1000.0))
    return squeezed.detach() + (safe - safe.detach())


# ---------- pool adjacent violators (exact) on the CPU: the Python reference, one row at a time ----------


def _pav_l2_row(y: list[float]) -> tuple[list[float], list[int]]:
    """Non-increasing isotonic regression of ``y`` by PAV: (block values, block sizes), left to right.

    Blocks are pushed one item at a time and merged with their left neighbour while that one is not
    strictly larger (a merge of equal values changes no value, not even by the rounding of their
    mean; it fixes which side's derivative the backward takes at such a tie)."""
    values: list[float] = []
    sums: list[float] = []
    sizes: list[int] = []
    for value in y:
        values.append(value)
        sums.append(value)
        sizes.append(1)
        while len(values) > 1 and values[-2] <= values[-1]:
            tie = values[-2] == values[-1]
            size = sizes.pop()
            total = sums.pop()
            values.pop()
            sizes[-1] += size
            sums[-1] += total
            if not tie:
                values[-1] = sums[-1] / sizes[-1]
    return values, sizes


def _cubic_block_value(n: int, s1: float, s2: float, s3: float, weight: float, low: float, high: float) -> float:
    """The root u of ``f(u) = Σ(r_i − u)^3 − weight`` (decreasing in u) from the block's power sums
    ``s_m = Σ r_i^m``, by Newton's method kept inside the bracket [low, high] (bisection otherwise)."""
    u = 0.5 * (low + high)
    for _ in range(200):
        value = s3 - 3.0 * u * s2 + 3.0 * u * u * s1 - n * u**3 - weight
        if value == 0.0:
            return u
        if value > 0.0:
            low = u
        else:
            high = u
        slope = -3.0 * (s2 - 2.0 * u * s1 + n * u * u)
        step = u - value / slope if slope < 0.0 else math.nan
        new = step if low < step < high else 0.5 * (low + high)
        if abs(new - u) <= 4e-16 * max(1.0, abs(u)) or not low < new < high:
            return new if low <= new <= high else u
        u = new
    return u


def _pav_l4_row(t: list[float], w: list[float]) -> tuple[list[float], list[int]]:
    """PAV for q = 4 (p = 4/3): a block's value γ solves ``Σ_B (t_i − γ)^3 = Σ_B w_i``.

    Each block keeps the power sums of ``t_i − c`` about its first item's ``t`` (c), so merging
    shifts the right block's sums binomially instead of summing large cubes."""
    values: list[float] = []
    blocks: list[list[float]] = []  # [c, n, s1, s2, s3, weight, min r, max r]
    for ti, wi in zip(t, w):
        values.append(ti - wi ** (1.0 / 3.0))
        blocks.append([ti, 1, 0.0, 0.0, 0.0, wi, 0.0, 0.0])
        while len(values) > 1 and values[-2] <= values[-1]:
            c2, n2, a1, a2, a3, w2, lo2, hi2 = blocks.pop()
            values.pop()
            block = blocks[-1]
            c, n, s1, s2, s3 = block[:5]
            d = c2 - c
            block[1] = n + n2
            block[2] = s1 + a1 + n2 * d
            block[3] = s2 + a2 + 2.0 * d * a1 + n2 * d * d
            block[4] = s3 + a3 + 3.0 * d * a2 + 3.0 * d * d * a1 + n2 * d**3
            block[5] += w2
            block[6] = min(block[6], lo2 + d)
            block[7] = max(block[7], hi2 + d)
            # f(max r) <= −weight <= 0; f(min r − (weight/n)^(1/3)) >= 0.
            low = block[6] - (block[5] / block[1]) ** (1.0 / 3.0)
            values[-1] = c + _cubic_block_value(block[1], block[2], block[3], block[4], block[5], low, block[7])
    return values, [block[1] for block in blocks]


@cache
def _build_native_pav():
    """``pav_cpu.cpp``: prebuilt with the package, else built (or loaded from torch's extension cache);
    raises where it cannot be built."""
    return load_native("topklab.operators._pav_cpu", NATIVE_SOURCE, "topklab_pav")


def native_pav(required: bool = False):
    """The C++ PAV (``pav_cpu.cpp``), prebuilt with the package or built on first use (cached on disk
    by torch, rebuilt when the source changes), or None where neither works: the first failure in a process warns
    once and is remembered (no second attempt). ``required``: a :class:`TopklabError` instead of None
    (and the failure is not remembered).

    Examples
    --------
    >>> extension = native_pav()  # None, with one warning, where no compiler or ninja is found
    >>> extension is None or callable(extension.isotonic)
    True
    """
    failure = _NATIVE_FAILURE.get("pav")
    if failure is None:
        try:
            return _build_native_pav()
        except Exception as error:
            failure = first_line(error)
            if not required:
                _NATIVE_FAILURE["pav"] = failure
                warnings.warn(
                    f"SparseTopK: the C++ PAV could not be built ({failure}); using the Python PAV instead "
                    "(the same values). Set kernel='python' to skip the attempt",
                    stacklevel=2,
                )
    if required:
        raise TopklabError(
            f"SparseTopK kernel='native', but the C++ PAV could not be built: {failure}; use kernel='auto' or 'python'"
        )
    return None


def isotonic_pav(t: torch.Tensor, w: torch.Tensor, p: float, kernel: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``t`` (batch, n): the solution ``v`` of the isotonic problem (module docstring) and
    each item's block index (batch, n), by exact PAV in float64 on the CPU.

    ``kernel``: "python" (the reference: a loop per row), "native" (the C++ routine, all rows in one
    call; a :class:`TopklabError` where it cannot be built) or "auto" (native where it can be built,
    else python). Both give the same bits.

    Examples
    --------
    >>> t, w = torch.tensor([[2.0, 0.5, 0.9, -1.0]]), torch.tensor([1.0, 1.0, 0.0, 0.0])
    >>> isotonic_pav(t, w, 2, kernel="python")  # t − w = (1, −0.5, 0.9, −1): the middle pair pools
    (tensor([[ 1.0000,  0.2000,  0.2000, -1.0000]]), tensor([[0, 1, 1, 2]]))
    """
    extension = None if kernel == "python" else native_pav(required=kernel == "native")
    if extension is not None:
        values, blocks = extension.isotonic(t.detach().cpu(), w.detach().cpu(), 2 if p == 2 else 4)
        return values.to(t.device), blocks.to(t.device)
    rows = t.detach().to("cpu", torch.float64).numpy()
    weights = w.detach().to("cpu", torch.float64).tolist()
    values = np.empty_like(rows)
    blocks = np.empty(rows.shape, dtype=np.int64)
    for b, row in enumerate(rows):
        if p == 2:
            block_values, sizes = _pav_l2_row((row - np.asarray(weights)).tolist())
        else:
            block_values, sizes = _pav_l4_row(row.tolist(), weights)
        values[b] = np.repeat(block_values, sizes)
        blocks[b] = np.repeat(np.arange(len(sizes)), sizes)
    return (torch.from_numpy(values).to(device=t.device, dtype=t.dtype), torch.from_numpy(blocks).to(t.device))


# ---------- Dykstra's alternating projections (approximate, batched), then an exact polish ----------


def _pool_pairs(a: torch.Tensor, start: int) -> torch.Tensor:
    """Projection onto ``{a_i >= a_{i+1}}`` for the disjoint pairs (start, start+1), (start+2, start+3),
    …: a violating pair is replaced by its mean, every other entry is kept."""
    batch, n = a.shape
    pairs = (n - start) // 2
    if pairs == 0:
        return a
    segment = a[:, start : start + 2 * pairs].reshape(batch, pairs, 2)
    left, right = segment[..., 0], segment[..., 1]
    violated = left < right
    mean = 0.5 * (left + right)
    pooled = torch.stack((torch.where(violated, mean, left), torch.where(violated, mean, right)), dim=-1)
    return torch.cat((a[:, :start], pooled.reshape(batch, 2 * pairs), a[:, start + 2 * pairs :]), dim=1)


def _polish(y: torch.Tensor, iterate: torch.Tensor, threshold: torch.Tensor):
    """Blocks read off an approximate solution (neighbours closer than ``threshold`` share a block),
    the exact block means of ``y`` on them, and whether those means pass the optimality test.

    ``v`` solves ``min ½‖v − y‖² s.t. v_1 >= … >= v_n`` iff it is non-increasing and the
    multipliers ``μ_j = Σ_{i<=j}(v_i − y_i)`` of the constraints v_j >= v_{j+1} are >= 0, zero
    where the constraint is slack (between blocks: each block's sum of y − v is 0 for block means).
    Both are checked to ``threshold``; the solution is unique, so a candidate that passes is it."""
    gaps = iterate[:, :-1] - iterate[:, 1:]
    blocks = torch.cat((torch.zeros_like(y[:, :1], dtype=torch.long), (gaps > threshold).long().cumsum(1)), dim=1)
    sums = torch.zeros_like(y).scatter_add_(1, blocks, y)
    sizes = torch.zeros_like(y).scatter_add_(1, blocks, torch.ones_like(y))
    values = (sums / sizes.clamp_min(1)).gather(1, blocks)
    monotone = (values[:, :-1] - values[:, 1:] >= -threshold).all(1)
    multipliers = ((values - y).cumsum(1) >= -threshold).all(1)
    return values, blocks, monotone & multipliers


def isotonic_dykstra(y: torch.Tensor, max_iter: int, tol: float, check_every: int = 10):
    """Non-increasing isotonic regression of each row of ``y`` (batch, n) by Dykstra's algorithm
    on the two sets ``C_even = {v_0 >= v_1, v_2 >= v_3, …}`` and ``C_odd = {v_1 >= v_2, …}``, whose
    projections are pairwise means (Sander et al.'s GPU/TPU-friendly isotonic solver). Every
    ``check_every`` iterations the blocks of the iterate are polished into exact block means and
    certified by the optimality test of :func:`_polish`; a certified row stops iterating.
    Returns (v, block index per item, certified)."""
    batch, n = y.shape
    eps = torch.finfo(y.dtype).eps
    scale = 1.0 + y.abs().amax(1, keepdim=True)
    threshold = torch.clamp(16 * eps * scale, min=tol)
    values = torch.empty_like(y)
    blocks = torch.zeros_like(y, dtype=torch.long)
    certified = torch.zeros(batch, dtype=torch.bool, device=y.device)
    rows = torch.arange(batch, device=y.device)
    x, p, q = y, torch.zeros_like(y), torch.zeros_like(y)
    for iteration in range(max_iter + 1):
        if iteration % check_every == 0 or iteration == max_iter:
            polished, found, ok = _polish(y[rows], x, threshold[rows])
            last = iteration == max_iter
            take = ok | last
            values[rows[take]], blocks[rows[take]] = polished[take], found[take]
            certified[rows[ok]] = True
            if last or bool(ok.all()):
                break
            keep = ~ok
            rows, x, p, q = rows[keep], x[keep], p[keep], q[keep]
        z = _pool_pairs(x + p, 0)
        p = x + p - z
        x_next = _pool_pairs(z + q, 1)
        q = z + q - x_next
        x = x_next
    return values, blocks, certified


# ---------- the mask and its backward ----------


def _block_sum(values: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Each item's block total of ``values`` (batch, n)."""
    return torch.zeros_like(values).scatter_add_(1, blocks, values).gather(1, blocks)


class _SortedMask(torch.autograd.Function):
    """``mask_sorted(t)`` from the solution ``v`` and its blocks; the backward uses the blocks.

    Inside a pooled block B, ``dγ/dt_j = ω_j / Σ_B ω`` (ω = 1 for p = 2, ω = (t_j − γ)^2 for p = 4/3,
    by the implicit-function theorem on the block's equation), so with ``u = t − v`` and
    ``m = u^(q−1)``: ``∂L/∂t_j = m'_j g_j − ω_j·Σ_B m'_i g_i / Σ_B ω``: for p = 2 the incoming gradient
    minus its block average; zero on singleton blocks, where the mask is the constant w."""

    @staticmethod
    def forward(ctx, t, w, v, blocks, q):
        sizes = _block_sum(torch.ones_like(t), blocks)
        # Singletons are exactly w (so the mask has exact 0s and 1s); pooled items are t − γ.
        u = torch.where(sizes == 1, w.expand_as(t), t - v)
        if q == 2:
            mask = u.clamp(0.0, 1.0)
            ctx.save_for_backward(blocks, sizes, None)
        else:
            u = u.clamp_min(0.0)
            mask = (u**3).clamp(0.0, 1.0)
            ctx.save_for_backward(blocks, sizes, u)
        ctx.q = q
        return mask

    @staticmethod
    def backward(ctx, grad):
        blocks, sizes, u = ctx.saved_tensors
        if ctx.q == 2:
            scaled = grad
            weight = torch.ones_like(grad)
        else:
            scaled = 3.0 * u * u * grad
            weight = u * u
        total_weight = _block_sum(weight, blocks)
        share = torch.where(
            total_weight > 0, weight / total_weight.clamp_min(torch.finfo(grad.dtype).tiny), 1.0 / sizes
        )
        grad_t = scaled - share * _block_sum(scaled, blocks)
        return torch.where(sizes == 1, torch.zeros_like(grad_t), grad_t), None, None, None, None


class SparseTopK(TopKOperator):
    """Sparse soft top-k mask: the p-norm regularised top-k linear program over the permutahedron.

    ``p = soft_topk(x, k)`` maximises ``⟨μ, x⟩ − (ℓ/p)‖μ‖_p^p`` over ``{μ ∈ [0, 1]^n : Σμ = k}``
    (module docstring). For p = 2 this is the Euclidean projection of x/ℓ onto that set, i.e.
    ``clip(x/ℓ − τ, 0, 1)`` per row with τ such that Σ = k: items far above the k-th score get exactly
    1, items far below exactly 0, and only the items within about ℓ of the threshold share the rest.
    Σp = k exactly (to rounding) and p has exact zeros and ones. Gradients flow through the pooled
    items only (zero on the exact 0s and 1s).

    Parameters
    ----------
    regularization : float > 0
        ℓ. Smaller is sharper and sparser: once ℓ is below the gap between the k-th and (k+1)-th
        score, ``p`` is the hard top-k mask (and its gradient is zero). Larger spreads the mass:
        ℓ → ∞ gives k/n everywhere. The authors' code defaults to 0.1.
    p : {2, 4/3}
        The norm of the regulariser. 2: piecewise linear (the mask has kinks); 4/3: continuously
        differentiable, still sparse (the authors' PAV default). 4/3 needs ``solver="pav"``.
    solver : {"pav", "dykstra"}
        "pav": exact pool-adjacent-violators on the CPU (the rows travel to the CPU and back), by
        ``kernel``. "dykstra": Sander et al.'s alternating projections onto the even and the
        odd pair constraints, batched in torch on the scores' device; p = 2 only. Its iterations
        grow about like the square of the largest pooled block (roughly the number of items within ℓ
        of the threshold), so it suits small ℓ or short rows.
    max_iter : int >= 1
        Dykstra only: the most iterations. A row whose solution is not certified by then keeps its
        last polished candidate, with a RuntimeWarning.
    tol : float > 0
        Dykstra only: neighbours of the iterate closer than ``tol`` (in mask units) are taken to
        share a block, and the optimality test is passed to ``tol``.
    kernel : {"auto", "native", "python"}
        PAV only. "native": C++ (``pav_cpu.cpp``, prebuilt with the package; without it built on
        first use, about a minute once; a :class:`TopklabError` where it is neither prebuilt nor buildable):
        the whole sorted mask and its backward for every row in one call (float32, float64; other
        dtypes the PAV alone). "python": the reference, torch operations and a Python PAV loop per
        row (2.4–8× slower here). "auto": native where it can be built, else python with one
        warning per process. Both give the same masks and gradients, bit for bit.

    Notes
    -----
    Dykstra's backward: not unrolled. Every 10 iterations the iterate's blocks are "polished" into
    the exact block means of the isotonic input and checked against the optimality conditions
    (:func:`_polish`); a row that passes is the exact solution (the isotonic solution is unique), so
    its forward equals PAV's to rounding and both solvers share one backward, the block averaging
    of the exact Jacobian. This is a deviation from the authors' Dykstra, which returns the raw
    iterate after a fixed number of iterations (500) and differentiates it by unrolling.

    Ties are broken as ``torch.topk`` breaks them (the sort is stable), which does not matter for
    p: tied scores straddling the threshold are pooled and share the same value.

    The scores enter as ``t = (x − x_[k])/ℓ``, squeezed logarithmically beyond ±4 (order and ties
    kept): the mask depends on differences of scores only, and with the k-th largest at 0 the
    threshold τ lies in [−1, 0] and only items with ``|t| <= 1`` can be pooled, so the squeeze
    changes neither p nor its gradient. Then no t overflows (x/ℓ would near the dtype's maximum,
    for ℓ < 1), and no pooled item sits at a magnitude where ``t − v`` loses the mask to rounding
    (as x/ℓ beyond 2^53 in float64, 2^24 in float32, would: a pooled tie of two scores at
    3.4e38 got mask 0 instead of 1).

    Extreme inputs (the rule of :mod:`topklab.operators.base`, the LP's own limit): +inf entries
    get 1, −inf entries 0, and the finite entries the mask of the finite entries with k − m₊ (m₊
    at +inf); more than k at +inf share k/m₊ each, and with fewer than k entries above −inf the
    finite ones get 1 and the −inf ones share the rest. Rows with an infinite score are solved per
    group of equal (n_f, k'), after one all-finite check (both solvers synchronise
    anyway). A NaN score makes its row NaN; an empty batch gives an empty result.

    Examples
    --------
    >>> op = SparseTopK(regularization=0.5)
    >>> op.soft_topk(torch.tensor([[3.0, 1.0, 0.9, -2.0]]), k=2)   # x/ℓ = (6, 2, 1.8, −4), τ = 1.4
    tensor([[1.0000, 0.6000, 0.4000, 0.0000]])
    >>> SparseTopK(regularization=0.5, solver="dykstra").soft_topk(torch.tensor([[3.0, 1.0, 0.9, -2.0]]), k=2)
    tensor([[1.0000, 0.6000, 0.4000, 0.0000]])
    >>> SparseTopK(regularization=0.01).soft_topk(torch.tensor([[3.0, 1.0, 0.9, -2.0]]), k=2)
    tensor([[1., 1., 0., 0.]])
    >>> op.soft_topk(torch.tensor([[float("inf"), 1.0, 0.9, -float("inf")]]), k=2)   # the mask of [1, 0.9] with k = 1
    tensor([[1.0000, 0.6000, 0.4000, 0.0000]])

    References
    ----------
    Sander, Puigcerver, Djolonga, Peyré & Blondel, "Fast, Differentiable and Sparse Top-k: a Convex
    Analysis Perspective", ICML 2023 (arXiv 2302.01425): the top-k mask as the LP
    ``argmax_{μ ∈ P(w)} ⟨μ, x⟩``, its regularisation ``− (ℓ/p)‖μ‖_p^p``, the isotonic problem
    ``argmin_{v_1 >= … >= v_n} 1/(q·ℓ^(q−1))·‖s − v‖_q^q + ⟨w, v⟩`` with ``mask = ((s − v)/ℓ)^(q−1)``
    (the form of the authors' ``isotonic_mask_pav``; the module docstring writes it in t = s/ℓ), PAV,
    and the Dykstra algorithm on the even/odd pair constraints; the authors' code is
    google-research/sparse_soft_topk. Blondel, Teboul, Berthet & Djolonga, "Fast Differentiable
    Sorting and Ranking", ICML 2020: projections onto the permutahedron by isotonic regression, and
    the block-averaging Jacobian of the isotonic solution.
    """

    sums_to_k = True
    sparse = True
    masks_extremes = False  # rows with infinite scores are solved per group of equal (n_f, k')

    def __init__(
        self,
        regularization: float = 0.1,
        p: float = 2.0,
        solver: str = "pav",
        max_iter: int = 2000,
        tol: float = 1e-6,
        kernel: str = "auto",
    ):
        super().__init__()
        self.regularization = positive(regularization, "regularization", "smaller = sharper and sparser")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (p == 2 or abs(p - 4 / 3) < 1e-6):
            raise ValueError(f"p={p!r} is not supported; choose 2 (Euclidean projection) or 4/3 (smooth)")
        if solver not in SOLVERS:
            raise ValueError(f"solver={solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
        if solver == "dykstra" and p != 2:
            raise ValueError("solver='dykstra' supports p=2 only; use solver='pav' for p=4/3")
        if kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r} is unknown; choose one of {', '.join(KERNELS)}")
        check_int("max_iter", max_iter)
        self.p = 2.0 if p == 2 else 4 / 3
        self.solver = solver
        self.max_iter = max_iter
        self.tol = positive(tol, "tol", "smaller = a tighter Dykstra solution")
        self.kernel = kernel

    def extra_repr(self) -> str:
        kernel = f", kernel={self.kernel!r}" if self.solver == "pav" else ""
        return f"regularization={self.regularization}, p={self.p:.4g}, solver={self.solver!r}{kernel}"

    def _soft_topk(self, scores: torch.Tensor, k: int, rest=None) -> torch.Tensor:
        n = scores.shape[1]
        ordered, order = torch.sort(scores, dim=1, descending=True, stable=True)
        t = (ordered - ordered[:, k - 1 : k].detach()) / self.regularization  # the k-th largest at 0
        q = 2 if self.p == 2 else 4
        fused = self.solver == "pav" and self.kernel != "python" and scores.dtype in (torch.float32, torch.float64)
        extension = native_pav(required=self.kernel == "native") if fused else None
        if extension is not None:  # _compress, PAV and _SortedMask in one C++ call, and its backward
            mask_sorted = extension.sparse_mask(t.cpu(), k, q).to(t.device)
            return torch.empty_like(mask_sorted).scatter(1, order, mask_sorted)
        t = _compress(t)  # see the class docstring
        w = (torch.arange(n, device=scores.device) < k).to(scores.dtype)
        with torch.no_grad():
            if self.solver == "pav":
                v, blocks = isotonic_pav(t, w, self.p, self.kernel)
            else:
                v, blocks, certified = isotonic_dykstra(t - w, self.max_iter, self.tol)
                if not bool(certified.all()):
                    warnings.warn(
                        f"SparseTopK: Dykstra did not certify {int((~certified).sum())} row(s) in "
                        f"max_iter={self.max_iter} iterations; raise max_iter or use solver='pav'",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        mask_sorted = _SortedMask.apply(t, w, v, blocks, q)
        return torch.empty_like(mask_sorted).scatter(1, order, mask_sorted)
