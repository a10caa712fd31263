"""Long-tailed subsampling with an exponential profile (Cao et al. 2019; PEL/LIFT's CIFAR-100-LT)."""

from __future__ import annotations

import numpy as np


def exponential_profile(n_max: int, num_classes: int, imbalance_ratio: float) -> list[int]:
    """Images per class ``n_c = int(n_max · ratio^(−c/(C−1)))`` for c = 0 … C−1.

    Parameters
    ----------
    n_max : int >= 1, images of the largest class (class 0)
    num_classes : int >= 2
    imbalance_ratio : float >= 1, ρ = n_max / n_min (1 = balanced)

    Examples
    --------
    >>> sum(exponential_profile(500, 100, 100))   # CIFAR-100-LT at ρ = 100 (papers.md §4.3)
    10847
    >>> exponential_profile(500, 10, 100)
    [500, 299, 179, 107, 64, 38, 23, 13, 8, 5]
    """
    if n_max < 1 or num_classes < 2:
        raise ValueError(f"need n_max >= 1 and num_classes >= 2, got n_max={n_max}, num_classes={num_classes}")
    if not imbalance_ratio >= 1:
        raise ValueError(f"imbalance_ratio={imbalance_ratio} must be >= 1 (ρ = largest / smallest class)")
    factor = 1.0 / imbalance_ratio
    counts = [int(n_max * factor ** (c / (num_classes - 1))) for c in range(num_classes)]
    if counts[-1] < 1:
        raise ValueError(
            f"n_max={n_max} with imbalance_ratio={imbalance_ratio} leaves the last class without images; "
            f"raise n_max to at least {imbalance_ratio:g} or lower the ratio"
        )
    return counts


def longtail_indices(labels: np.ndarray, counts: list[int], seed: int) -> np.ndarray:
    """Indices of a long-tailed subset: per class c, ``counts[c]`` images drawn without replacement.

    The draw uses its own ``seed`` (not the training seed), so the subset is fixed across training
    seeds. Returned sorted, so the subset does not depend on the order classes are visited in.
    """
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    chosen = []
    for c, n_c in enumerate(counts):
        pool = np.flatnonzero(labels == c)
        if n_c > len(pool):
            raise ValueError(f"class {c} has {len(pool)} images, fewer than the {n_c} the profile asks for")
        chosen.append(rng.permutation(pool)[:n_c])
    return np.sort(np.concatenate(chosen))
