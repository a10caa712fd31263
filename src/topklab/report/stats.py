"""Summary statistics shared by the renderers (and by the synthetic experiments' logs)."""

from __future__ import annotations

import statistics


def mean_std(values) -> tuple[float, float]:
    """Mean and population std (0 for a single value).

    Parameters
    ----------
    values : iterable of numbers (at least one)

    Examples
    --------
    >>> mean_std([1, 3])
    (2.0, 1.0)
    >>> mean_std([5.0])
    (5.0, 0.0)
    """
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)
