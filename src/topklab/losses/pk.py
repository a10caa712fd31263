"""P_K, the distribution over k of the top-k cross-entropy (Petersen et al., ICML 2022, §3)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence


def validate_p_k(p_k: Sequence[float], num_classes: int | None = None, atol: float = 1e-4) -> list[float]:
    """Check P_K = (P(k=1), …, P(k=K)) and return it as a list of floats.

    Parameters
    ----------
    p_k : sequence of K non-negative numbers summing to 1 (within ``atol``; difftopk uses 1e-4)
        e.g. ``[.5, 0, 0, 0, .5]`` = half top-1, half top-5.
    num_classes : int or None
        When given, K must not exceed it.

    Examples
    --------
    >>> validate_p_k([0.25, 0, 0, 0, 0.75], num_classes=100)
    [0.25, 0.0, 0.0, 0.0, 0.75]
    """
    if isinstance(p_k, (str, bytes)) or not isinstance(p_k, Sequence) or len(p_k) == 0:
        raise TypeError(f"P_K must be a non-empty list of probabilities such as [0.5, 0, 0, 0, 0.5], got {p_k!r}")
    values = []
    for i, p in enumerate(p_k):
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(
                f"P_K[{i}]={p!r} is not a number; P_K is a list of probabilities such as [0.5, 0, 0, 0, 0.5]"
            )
        if not math.isfinite(p) or p < 0:
            raise ValueError(f"P_K[{i}]={p} must be a finite non-negative probability")
        values.append(float(p))
    if abs(sum(values) - 1.0) > atol:
        raise ValueError(f"P_K={values} sums to {sum(values):.6g}, not 1; rescale it")
    if num_classes is not None and len(values) > num_classes:
        raise ValueError(
            f"P_K has length {len(values)} > {num_classes} classes; K must not exceed the number of classes"
        )
    return values
