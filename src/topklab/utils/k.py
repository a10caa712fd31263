"""The ``k`` of a top-k aggregate or operator: a count or a fraction of the row (n losses or scores)."""

from __future__ import annotations

import math
import numbers


def validate_k(k: int | float) -> int | float:
    """Check that ``k`` is a positive count (``int``) or a fraction in (0, 1] (``float``).

    ``1`` (int) means "the single largest loss"; ``1.0`` (float) means "the whole batch".
    Raises ``ValueError``/``TypeError`` with a message saying how to fix the value.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise TypeError(
            f"k must be an int (a count) or a float in (0, 1] (a fraction of the batch), "
            f"got {k!r} of type {type(k).__name__}"
        )
    if isinstance(k, numbers.Integral):
        if k <= 0:
            raise ValueError(f"k={k} must be a positive count (int >= 1) or a fraction in (0, 1]")
        return int(k)
    k = float(k)
    if not math.isfinite(k) or not 0.0 < k <= 1.0:
        raise ValueError(f"k={k} as a float is a fraction of the batch and must lie in (0, 1]; pass an int for a count")
    return k


def resolve_k(k: int | float, n: int) -> int:
    """The integer count that ``k`` stands for in a batch of ``n`` losses.

    A fraction is rounded half-up (``round(0.9 * 16) = 14``, ``0.05 * 10 -> 1``) and never
    below 1. A count larger than ``n`` is an error rather than silently clipped.
    """
    if n <= 0:
        raise ValueError("cannot aggregate an empty batch of losses (n=0)")
    if isinstance(k, float):
        return max(1, math.floor(k * n + 0.5 + 1e-9))
    if k > n:
        raise ValueError(
            f"k={k} exceeds the number of losses n={n}; use k <= n (e.g. a batch of at "
            f"least {k}) or a fraction in (0, 1]"
        )
    return k
