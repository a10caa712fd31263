"""Ways to compute the sum of the k largest of n numbers (STk paper Table 1, §4.1).

The paper's algorithms, as we read them:

- :func:`bubble_sort_topk_sum`, :func:`heap_sort_topk_sum`: full sorts written in pure Python
  (interpreted loops over a Python list), then the first k.
- :func:`lambda_iteration`: the ATk and STk rows. Both minimise over a scalar λ, with Adam on
  ``F(λ)/n``, an objective whose minimum is the top-k sum (Eq. 1 for ATk, its SReLU smoothing Eq. 3
  for STk); each iteration is O(n) vectorised torch work driven from Python. The answer read out at
  any λ is Eq. 1, ``Σ[e_i − λ]_+ + kλ`` (exact, and equal to the top-k sum on [e_[k+1], e_[k]]),
  and iteration stops once it is within ``tol`` of the true sum (the paper's "until the error is
  less than 1e-2"; the true sum is computed beforehand, outside the timer).

Ours (not in the paper), on the same objectives with the same read-out and stopping rule, each for
torch tensors and numpy arrays (the backend follows the type of ``values``):

- :func:`stk_newton`: safeguarded Newton on Eq. 3's ``F'(λ) = 0`` (``F'' > 0``), bisection inside a
  bracket whenever Newton's point is not good enough.
- :func:`atk_bisection`: bisection on λ with the subgradient ``k − #{e_i > λ}`` of Eq. 1.
- :func:`atk_selection`: λ = e_[k] by one selection (``torch.kthvalue`` / ``np.partition``), then Eq. 1.

For reference: :func:`sort_topk_sum`, ``torch.sort`` then the first k (compiled C++).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from topklab.smoothing import srelu


def bubble_sort_topk_sum(values: list[float], k: int) -> float:
    """Bubble sort into descending order (with the usual early exit), then sum the first k."""
    a = list(values)
    n = len(a)
    for end in range(n - 1, 0, -1):
        swapped = False
        for i in range(end):
            if a[i] < a[i + 1]:
                a[i], a[i + 1] = a[i + 1], a[i]
                swapped = True
        if not swapped:
            break
    return sum(a[:k])


def _sift_down(a: list[float], start: int, end: int) -> None:
    root = start
    while True:
        child = 2 * root + 1
        if child > end:
            return
        if child + 1 <= end and a[child] > a[child + 1]:
            child += 1
        if a[root] > a[child]:
            a[root], a[child] = a[child], a[root]
            root = child
        else:
            return


def heap_sort_topk_sum(values: list[float], k: int) -> float:
    """Heap sort into descending order with a min-heap (pure Python, no ``heapq``), then sum the
    first k."""
    a = list(values)
    n = len(a)
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(a, start, n - 1)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift_down(a, 0, end - 1)
    return sum(a[:k])


def sort_topk_sum(values: torch.Tensor, k: int) -> float:
    return float(torch.sort(values, descending=True).values[:k].sum())


def exact_objective(values: torch.Tensor, lam: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 1 at λ: ``Σ[e_i − λ]_+ + kλ`` (>= the top-k sum, equal on [e_[k+1], e_[k]])."""
    return torch.relu(values - lam).sum() + k * lam


def lambda_iteration(
    values: torch.Tensor,
    k: int,
    target: float,
    method: str,
    delta: float = 0.01,
    lr: float = 0.1,
    tol: float = 1e-2,
    lam_init: float = 0.0,
    max_iter: int = 100_000,
) -> tuple[float, int]:
    """Minimise ``F(λ)/n`` over λ with Adam until Eq. 1 at λ is within ``tol`` of ``target``.

    Parameters
    ----------
    values : (n,) tensor
    k : int in [1, n]
    target : float, the true top-k sum (for the stopping rule only)
    method : {"atk", "stk"}, ``F`` = Eq. 1 (subgradient) or Eq. 3 (SReLU with width ``delta``)
    delta : float > 0, SReLU width (smaller = closer to Eq. 1)
    lr : float > 0, Adam step size

    Returns the top-k sum read out at the final λ and the number of iterations.
    """
    if method not in ("atk", "stk"):
        raise ValueError(f"unknown method {method!r}; choose atk or stk")
    n = values.numel()
    lam = torch.tensor(float(lam_init), dtype=values.dtype, requires_grad=True)
    optimizer = torch.optim.Adam([lam], lr=lr)
    for iteration in range(1, max_iter + 1):
        with torch.no_grad():
            answer = float(exact_objective(values, lam, k))
        if abs(answer - target) < tol:
            return answer, iteration - 1
        phi = torch.relu(values - lam) if method == "atk" else srelu(values - lam, delta)
        objective = (phi.sum() + k * lam) / n
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        optimizer.step()
    raise RuntimeError(
        f"{method} λ-iteration did not reach error < {tol} in {max_iter} iterations; raise lr or max_iter"
    )


# ---------- ours: bracketed solvers on the same objectives, for torch and numpy ----------

Array = torch.Tensor | np.ndarray


@dataclass(frozen=True)
class _Ops:
    """The few operations the solvers below need that torch and numpy spell differently (``-``, ``*``,
    ``/``, ``>``, ``.sum()``, ``.min()``, ``.max()`` are shared)."""

    name: str
    is_float: Callable[[Array], bool]
    sqrt: Callable[[Array], Array]
    relu: Callable[[Array], Array]
    kth_largest: Callable[[Array, int], float]


_BACKENDS: tuple[tuple[type, _Ops], ...] = (
    (
        torch.Tensor,
        _Ops(
            "torch",
            torch.is_floating_point,
            torch.sqrt,
            torch.relu,
            lambda v, k: float(torch.kthvalue(v, len(v) - k + 1).values),
        ),
    ),
    (
        np.ndarray,
        _Ops(
            "numpy",
            lambda v: np.issubdtype(v.dtype, np.floating),
            np.sqrt,
            lambda x: np.maximum(x, 0.0),
            lambda v, k: float(np.partition(v, len(v) - k)[len(v) - k]),
        ),
    ),
)


def _ops_for(values: Array, k: int) -> _Ops:
    """The backend of ``values`` after checking it is a non-empty 1-D float array and 1 <= k <= n."""
    ops = next((ops for kind, ops in _BACKENDS if isinstance(values, kind)), None)
    if ops is None:
        raise ValueError(f"values must be a torch.Tensor or a numpy.ndarray, got {type(values).__name__}")
    if (
        values.ndim != 1
        or len(values) == 0
        or not ops.is_float(values)
        or values.dtype not in (torch.float64, np.float64)
    ):
        raise ValueError(
            f"values must be a non-empty 1-D float64 {ops.name} array (λ is a Python float, and float32 "
            f"sums cancel near the root), got shape {tuple(values.shape)} and dtype {values.dtype}"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(values):
        raise ValueError(f"k must be an integer in [1, n = {len(values)}], got {k!r}")
    return ops


def _eq1(ops: _Ops, x: Array, lam: float, k: int) -> float:
    """Eq. 1 at λ from ``x = values − λ``: ``Σ[x_i]_+ + kλ``."""
    return float(ops.relu(x).sum()) + k * lam


# slope(x = values − λ, λ) -> (the (sub)gradient of the objective at λ, Newton's next λ or nan)
Slope = Callable[[Array, float], tuple[float, float]]


def _bracketed_search(
    values: Array,
    ops: _Ops,
    k: int,
    target: float,
    tol: float,
    lam: float,
    lo: float,
    hi: float,
    slope: Slope,
    max_iter: int,
    what: str,
    collapsed_hint: str,
) -> tuple[float, int]:
    """Shared loop of :func:`stk_newton` and :func:`atk_bisection` (their docstrings give the rule).

    Each pass reads Eq. 1 out at λ and stops if it is within ``tol`` of ``target``; otherwise it
    moves the bracket end on λ's side of the root to λ (slope <= 0: λ is left of it), then takes
    Newton's point if it lies strictly inside the bracket and the last two updates have at least
    halved the bracket, and the bracket's midpoint otherwise. So for every update j either the
    width W_j <= W_{j-2}/2 already, or j bisects and W_{j+1} <= W_j/2: W_{j+1} <= W_{j-2}/2, the
    bracket halves at least every three updates. A λ outside the bracket (a far ``lam_init``) moves
    no end. If the bracket shrinks to adjacent floats first, the stopping rule cannot be met.
    """
    widths = [math.inf, math.inf]  # the bracket's width after the update before last, after the last
    for iteration in range(max_iter + 1):
        x = values - lam
        answer = _eq1(ops, x, lam, k)
        if abs(answer - target) < tol:
            return answer, iteration
        if iteration == max_iter:
            break
        gradient, newton = slope(x, lam)
        if lo < lam < hi:
            if gradient <= 0:
                lo = lam
            else:
                hi = lam
        middle = 0.5 * (lo + hi)
        if not lo < middle < hi:
            raise RuntimeError(
                f"{what}: the λ bracket collapsed at {middle:.17g} with Eq. 1 error "
                f"{abs(answer - target):.3g} >= tol {tol}; {collapsed_hint}"
            )
        newton_ok = lo < newton < hi and hi - lo <= 0.5 * widths[0]
        widths = [widths[1], hi - lo]
        lam = newton if newton_ok else middle
    raise RuntimeError(f"{what} did not reach error < {tol} in {max_iter} iterations; raise max_iter")


def stk_newton(
    values: Array,
    k: int,
    target: float,
    delta: float = 0.01,
    tol: float = 1e-2,
    lam_init: float = 0.0,
    max_iter: int = 200,
) -> tuple[float, int]:
    """Minimise STk's objective (Eq. 3) over λ by safeguarded Newton until Eq. 1 at λ is within ``tol``
    of ``target`` (ours, not the paper's iteration).

    ``F(λ) = Σ SReLU_δ(e_i − λ) + kλ`` with ``SReLU_δ(x) = ½(x + √(x² + δ²) − δ)`` (Eq. 2, 3), so with
    ``x_i = e_i − λ`` and ``r_i = √(x_i² + δ²)``::

        F'(λ)  = k − Σ ½(1 + x_i / r_i)          (k minus a smoothed count of e_i > λ)
        F''(λ) = Σ ½ δ² / r_i³ > 0               (F' increases: one root, F's minimiser)

    Newton's point ``λ − F'/F''`` is taken when it lies strictly inside a bracket [lo, hi] with
    ``F'(lo) < 0 < F'(hi)`` and the last two updates have at least halved the bracket; otherwise the
    bracket's midpoint (so the bracket halves at least every three updates and the loop cannot
    stall: far from the root ``F''`` is tiny between sparse samples and Newton overshoots). After each
    update the bracket end on the new λ's side moves to it. Iterations are these updates.

    Initial bracket, for k < n: ``lo = min e − δ√(n/(n−k))``, ``hi = max e + δ√(n/k)``. Valid because
    ``SReLU'(x) = ½(1 + x/√(x²+δ²)) <= δ²/(4x²)`` for x < 0 and ``SReLU'(x) = 1 − SReLU'(−x)``: at hi
    every ``x_i <= −δ√(n/k)``, so ``Σ SReLU' <= k/4 < k`` and ``F'(hi) > 0``; at lo every
    ``x_i >= δ√(n/(n−k))``, so ``Σ SReLU' >= n − (n−k)/4 > k`` and ``F'(lo) < 0``. For k = n, F' > 0
    everywhere (no minimiser; F decreases towards λ → −∞), but Eq. 1 at any λ <= min e is exactly
    ``Σ e_i``, so ``lo = min e − δ`` is the left end.

    λ starts at ``lam_init`` = 0 like :func:`lambda_iteration` (for centred data 0 is also a natural
    guess; a start outside the bracket costs one bisection).

    Parameters
    ----------
    values : (n,) float tensor or numpy array, the e_i (the backend follows the type)
    k : int in [1, n]
    target : float, the true top-k sum (for the stopping rule only; compute it outside a timer)
    delta : float > 0, SReLU width δ (smaller = closer to Eq. 1, and sharper steps in F')
    tol : float > 0, stop once ``|Eq. 1 at λ − target| < tol``
    lam_init : float, the first λ
    max_iter : int >= 0, the most updates before a RuntimeError

    Returns the top-k sum read out at the final λ (Eq. 1) and the number of updates.

    Raises RuntimeError after ``max_iter`` updates, or when the bracket collapses onto F's minimiser
    with Eq. 1 still ``tol`` or more away: Eq. 3's minimiser need not lie in Eq. 1's [e_[k+1], e_[k]].
    A large group tied at e_[k] moves it about δ past the tie, and Eq. 1 there is off by that times
    the tie's members among the top k (10 equal maxima, k = 1, δ = 0.01: 0.013); values spaced far
    closer than δ near e_[k] (data scaled by 1e-3) move it further. Lower ``delta`` then.

    Examples
    --------
    >>> values = torch.tensor([3.0, -1.0, 2.0, 0.5, 4.0], dtype=torch.float64)
    >>> answer, iterations = stk_newton(values, 2, target=7.0)
    >>> round(answer, 6), iterations <= 10
    (7.0, True)
    >>> stk_newton(values.numpy(), 2, target=7.0)[0]
    7.0
    """
    ops = _ops_for(values, k)
    if not delta > 0 or not tol > 0:
        raise ValueError(f"delta and tol must be > 0, got delta={delta}, tol={tol}")
    n = len(values)
    d2 = delta * delta
    low, high = float(values.min()), float(values.max())
    lo = low - delta * (math.sqrt(n / (n - k)) if k < n else 1.0)
    hi = high + delta * math.sqrt(n / k)

    def slope(x: Array, lam: float) -> tuple[float, float]:
        r = ops.sqrt(x * x + d2)
        gradient = k - 0.5 * (n + float((x / r).sum()))
        curvature = 0.5 * d2 * float((1.0 / (r * r * r)).sum())
        return gradient, (lam - gradient / curvature if curvature > 0 else math.nan)

    return _bracketed_search(
        values,
        ops,
        k,
        target,
        tol,
        float(lam_init),
        lo,
        hi,
        slope,
        max_iter,
        "STk Newton",
        f"Eq. 3's minimiser (δ = {delta}) is not Eq. 1's here; lower delta",
    )


def atk_bisection(
    values: Array, k: int, target: float, tol: float = 1e-2, lam_init: float = 0.0, max_iter: int = 200
) -> tuple[float, int]:
    """Minimise ATk's objective (Eq. 1) over λ by bisection until Eq. 1 at λ is within ``tol`` of
    ``target`` (ours, not the paper's iteration).

    ``F(λ) = Σ[e_i − λ]_+ + kλ`` has the subgradient ``k − #{e_i > λ}``, which is <= 0 exactly when
    λ < e_[k] (at least k values lie above λ). The bracket starts as ``lo = min e − tol`` (all n above,
    so lo < e_[k]) and ``hi = max e`` (none above, so hi >= e_[k]); each update moves the end on λ's
    side to λ and sets λ to the midpoint, keeping ``lo < e_[k] <= hi``. Eq. 1 is exact once λ lies in
    [e_[k+1], e_[k]]. λ starts at ``lam_init`` = 0 (read out, then used to shrink the bracket if it
    lies inside). Iterations are the updates.

    Parameters
    ----------
    values : (n,) float tensor or numpy array, the e_i (the backend follows the type)
    k : int in [1, n]
    target : float, the true top-k sum (for the stopping rule only)
    tol : float > 0, stop once ``|Eq. 1 at λ − target| < tol``
    lam_init : float, the first λ
    max_iter : int >= 0, the most updates before a RuntimeError

    Returns the top-k sum read out at the final λ (Eq. 1) and the number of updates.

    Examples
    --------
    >>> values = np.array([3.0, -1.0, 2.0, 0.5, 4.0])
    >>> atk_bisection(values, 2, target=7.0)
    (7.0, 1)
    """
    ops = _ops_for(values, k)
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    lo, hi = float(values.min()) - tol, float(values.max())

    def slope(x: Array, lam: float) -> tuple[float, float]:
        return k - float((x > 0).sum()), math.nan

    return _bracketed_search(
        values,
        ops,
        k,
        target,
        tol,
        float(lam_init),
        lo,
        hi,
        slope,
        max_iter,
        "ATk bisection",
        "tol is below the rounding error of Eq. 1; raise tol",
    )


def atk_selection(values: Array, k: int) -> tuple[float, int]:
    """λ = e_[k], the k-th largest value, by one selection (``torch.kthvalue`` / ``np.partition``,
    O(n)), then Eq. 1 at λ, which is exactly the top-k sum there (ours; counted as 1 iteration).

    Parameters
    ----------
    values : (n,) float tensor or numpy array (the backend follows the type)
    k : int in [1, n]

    Examples
    --------
    >>> atk_selection(torch.tensor([3.0, -1.0, 2.0, 0.5, 4.0], dtype=torch.float64), 2)
    (7.0, 1)
    """
    ops = _ops_for(values, k)
    lam = ops.kth_largest(values, k)
    return _eq1(ops, values - lam, lam, k), 1
