"""Two Gaussian classes with a shared Toeplitz covariance (STk paper §4.2; papers.md §1.10).

The paper prints Σ_jk = 0.25^(0.5+|j−k|), whose diagonal is 0.5; the likely intended form is
0.5^|j−k|. Both are offered (``covariance="printed"|"intended"``); Table 2 uses ``printed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from topklab.utils.errors import TopklabError

# name -> (base, offset) of Σ_jk = base^(offset + |j−k|)
COVARIANCES = {"printed": (0.25, 0.5), "intended": (0.5, 0.0)}


def toeplitz_covariance(d: int, base: float, offset: float = 0.0) -> torch.Tensor:
    """Σ_jk = base^(offset + |j−k|), float64, (d, d).

    Examples
    --------
    >>> toeplitz_covariance(2, 0.8)
    tensor([[1.0000, 0.8000],
            [0.8000, 1.0000]], dtype=torch.float64)
    """
    idx = torch.arange(d, dtype=torch.float64)
    return torch.as_tensor(base, dtype=torch.float64) ** (offset + (idx[:, None] - idx[None, :]).abs())


@dataclass
class SyntheticSplit:
    """Features (n, d) float32 and labels (n,) in {0, 1} (1 = positive, the shifted mean)."""

    x: torch.Tensor
    y: torch.Tensor


@dataclass
class GaussianTask:
    """Class 0 (negative) ~ N(0, Σ), class 1 (positive) ~ N(μ₁, Σ), μ₁ = ``shift`` on the first
    ``n_signal`` coordinates and 0 elsewhere.

    Parameters
    ----------
    d : int >= 1, dimension (paper: 200)
    n_signal : int in [1, d], coordinates where the class means differ (paper: 10)
    shift : float, value of μ₁ on those coordinates (paper: 1)
    covariance : {"printed", "intended"}, Σ_jk = 0.25^(0.5+|j−k|) or 0.5^|j−k|
    rho : float in (-1, 1) or None, overrides ``covariance`` with Σ_jk = rho^|j−k| (Figure 3: 0.8)

    Examples
    --------
    >>> task = GaussianTask(d=4, n_signal=2)
    >>> split = task.sample(10, positive_fraction=0.8, generator=torch.Generator().manual_seed(0))
    >>> int(split.y.sum()), tuple(split.x.shape)
    (8, (10, 4))
    """

    d: int = 200
    n_signal: int = 10
    shift: float = 1.0
    covariance: str = "printed"
    rho: float | None = None

    def __post_init__(self):
        if not (
            isinstance(self.d, int) and self.d >= 1 and isinstance(self.n_signal, int) and 1 <= self.n_signal <= self.d
        ):
            raise TopklabError(f"synthetic d={self.d}, n_signal={self.n_signal}: need ints with 1 <= n_signal <= d")
        if self.rho is None:
            if self.covariance not in COVARIANCES:
                raise TopklabError(
                    f"unknown covariance {self.covariance!r}; choose one of: {', '.join(COVARIANCES)} (or set rho)"
                )
            self.cov = toeplitz_covariance(self.d, *COVARIANCES[self.covariance])
        else:
            if not -1 < self.rho < 1:
                raise TopklabError(f"rho={self.rho} must lie in (-1, 1) for a positive-definite covariance")
            self.cov = toeplitz_covariance(self.d, self.rho)
        self.mean_neg = torch.zeros(self.d, dtype=torch.float64)
        self.mean_pos = torch.zeros(self.d, dtype=torch.float64)
        self.mean_pos[: self.n_signal] = self.shift
        self._chol = torch.linalg.cholesky(self.cov)

    def sample(self, n: int, positive_fraction: float, generator: torch.Generator) -> SyntheticSplit:
        """``n`` rows, exactly ``round(n·positive_fraction)`` positives (at least one of each
        class), shuffled."""
        if not 0.0 < positive_fraction < 1.0:
            raise TopklabError(f"positive_fraction={positive_fraction} must lie in (0, 1)")
        n_pos = min(n - 1, max(1, math.floor(n * positive_fraction + 0.5)))
        y = torch.zeros(n, dtype=torch.float64)
        y[:n_pos] = 1.0
        z = torch.randn(n, self.d, generator=generator, dtype=torch.float64)
        x = z @ self._chol.T + torch.where(y[:, None] > 0, self.mean_pos, self.mean_neg)
        order = torch.randperm(n, generator=generator)
        return SyntheticSplit(x=x[order].float(), y=y[order].float())

    def bayes_direction(self) -> torch.Tensor:
        """Σ⁻¹(μ₁ − μ₀), the weight vector of the Bayes (LDA) rule, with entries below 1e-9 of its
        largest set to exactly 0: its support is the coordinates a sparse model should select (11 for
        both of the paper's covariances, not the 10 where the means differ: Σ⁻¹ spreads the shift).

        Examples
        --------
        >>> int((GaussianTask().bayes_direction() != 0).sum())
        11
        """
        direction = torch.linalg.solve(self.cov, self.mean_pos - self.mean_neg)
        return torch.where(direction.abs() > 1e-9 * direction.abs().max(), direction, torch.zeros_like(direction))

    def bayes_accuracy(self, positive_fraction: float = 0.5) -> float:
        """Accuracy of the LDA rule at class prior ``positive_fraction`` (on data with that prior)."""
        diff = self.mean_pos - self.mean_neg
        delta = math.sqrt(float(diff @ torch.linalg.solve(self.cov, diff)))
        shift = math.log(positive_fraction / (1 - positive_fraction)) / delta
        phi = lambda t: 0.5 * (1 + math.erf(t / math.sqrt(2)))  # noqa: E731
        return positive_fraction * phi(delta / 2 + shift) + (1 - positive_fraction) * phi(delta / 2 - shift)
