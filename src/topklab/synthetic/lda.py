"""The theoretical (LDA) decision boundary of two Gaussians with a shared covariance."""

from __future__ import annotations

import math

import torch


def lda_boundary(
    mean_neg: torch.Tensor, mean_pos: torch.Tensor, cov: torch.Tensor, prior_pos: float
) -> tuple[torch.Tensor, float]:
    """Bayes boundary ``wᵀx + b = 0`` (positive where > 0):

    ``w* = Σ⁻¹(μ₁ − μ₀)``, ``b* = ½(μ₀ᵀΣ⁻¹μ₀ − μ₁ᵀΣ⁻¹μ₁) + ln(π₁/π₀)``.

    The STk paper's Eq. 8 prints ``+`` between the quadratic terms; its own 2-D example
    (b* = −0.836) needs the ``−`` used here (papers.md §1.10).

    Parameters
    ----------
    mean_neg, mean_pos : (d,) class means μ₀ (negative) and μ₁ (positive)
    cov : (d, d) shared covariance Σ
    prior_pos : float in (0, 1), π₁ = Pr(Y = positive)

    Examples
    --------
    >>> cov = torch.tensor([[1.0, 0.8], [0.8, 1.0]], dtype=torch.float64)
    >>> w, b = lda_boundary(torch.zeros(2, dtype=torch.float64), torch.tensor([2.0, 2.0], dtype=torch.float64), cov, 0.8)
    >>> [round(v, 3) for v in w.tolist()], round(b, 3)
    ([1.111, 1.111], -0.836)
    """
    if not 0.0 < prior_pos < 1.0:
        raise ValueError(f"prior_pos={prior_pos} must lie in (0, 1)")
    solve = lambda v: torch.linalg.solve(cov, v)  # noqa: E731
    w = solve(mean_pos - mean_neg)
    b = 0.5 * float(mean_neg @ solve(mean_neg) - mean_pos @ solve(mean_pos)) + math.log(prior_pos / (1 - prior_pos))
    return w, b
