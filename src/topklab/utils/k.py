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


def check_k_tensor(k, error: type[Exception] = ValueError):
    """A tensor ``k`` of one k per row, checked: counts (an integer dtype, each >= 1) or fractions (a
    floating dtype, each in (0, 1]), as a detached CPU copy; else a one-line ``error``.

    Examples
    --------
    >>> import torch
    >>> check_k_tensor(torch.tensor([1, 3])), check_k_tensor(torch.tensor([0.5, 1.0]))
    (tensor([1, 3]), tensor([0.5000, 1.0000]))
    """
    import torch

    k = k.detach().to("cpu", copy=True)
    if k.is_floating_point():
        if not bool(((k > 0) & (k <= 1)).all()):
            raise error(
                f"k={k.tolist()} as a floating tensor holds per-row fractions, each in (0, 1]; "
                f"pass an integer tensor for counts"
            )
    elif k.dtype == torch.bool or k.is_complex():
        raise error(f"k of dtype {k.dtype} must hold integer counts or floating fractions in (0, 1]")
    elif not bool((k >= 1).all()):
        raise error(f"k={k.tolist()} as an integer tensor holds per-row counts, each >= 1")
    return k


def resolve_k_tensor(k, n: int, batch, dim: int, error: type[Exception] = ValueError, items: str = "losses"):
    """Each row's count (P,) as float64 on the CPU, from a checked tensor ``k`` (:func:`check_k_tensor`)
    broadcast to ``batch`` (the shape of the rows: the input's shape without ``dim``) for rows of n:
    fractions rounded as :func:`resolve_k` rounds them; a count above n or a shape that does not fit is
    a one-line ``error`` (``items``: what the rows hold, for its message).

    Examples
    --------
    >>> import torch
    >>> resolve_k_tensor(torch.tensor([0.5, 0.05]), 10, torch.Size([2]), -1)
    tensor([5., 1.], dtype=torch.float64)
    """
    import torch

    try:
        rows = torch.broadcast_to(k, batch).reshape(-1)
    except RuntimeError:
        raise error(
            f"k of shape {tuple(k.shape)} does not fit {items} with rows of shape {tuple(batch)} "
            f"(the shape without dim={dim}); give one k per row, a shape broadcastable to it"
        ) from None
    if rows.is_floating_point():
        return torch.floor(rows.to(torch.float64) * n + 0.5 + 1e-9).clamp(min=1)  # resolve_k's rounding, per row
    if rows.numel() and int(rows.max()) > n:
        raise error(f"k={int(rows.max())} exceeds the number of {items} n={n}; use counts <= n or fractions in (0, 1]")
    return rows.to(torch.float64)
