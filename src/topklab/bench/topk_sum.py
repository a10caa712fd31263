"""Four ways to compute the sum of the k largest of n numbers (STk paper Table 1, §4.1).

- :func:`bubble_sort_topk_sum`, :func:`heap_sort_topk_sum`: full sorts written in pure Python
  (interpreted loops over a Python list), then the first k.
- :func:`lambda_iteration`: the ATk and STk rows. Both minimise over a scalar λ, with Adam on
  ``F(λ)/n``, an objective whose minimum is the top-k sum (Eq. 1 for ATk, its SReLU smoothing Eq. 3
  for STk); each iteration is O(n) vectorised torch work driven from Python. The answer read out at
  any λ is Eq. 1, ``Σ[e_i − λ]_+ + kλ`` (exact, and equal to the top-k sum on [e_[k+1], e_[k]]),
  and iteration stops once it is within ``tol`` of the true sum (the paper's "until the error is
  less than 1e-2"; the true sum is computed beforehand, outside the timer).
- :func:`sort_topk_sum`: ``torch.sort`` then the first k (compiled C++), for reference.
"""
from __future__ import annotations

import torch

from topklab.losses.smoothing import srelu


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


def lambda_iteration(values: torch.Tensor, k: int, target: float, method: str, delta: float = 0.01,
                     lr: float = 0.1, tol: float = 1e-2, lam_init: float = 0.0,
                     max_iter: int = 100_000) -> tuple[float, int]:
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
    raise RuntimeError(f"{method} λ-iteration did not reach error < {tol} in {max_iter} iterations; raise lr or max_iter")
