"""The trainable threshold λ of MATk/STk and how the constraint λ >= 0 is kept.

The STk paper writes ``min over λ >= 0`` (Eqs. 1, 3) but does not say how SGD-STk keeps λ >= 0,
nor how λ starts. Both are therefore explicit choices:

- ``none``: λ = ``lam``, unconstrained (for non-negative losses the optimum λ* = ℓ_[k] >= 0 anyway).
- ``clamp``: projected gradient descent; ``lam`` is clamped to >= 0 in place at every forward,
  so the projection happens in any training loop without extra calls.
- ``softplus``: λ = softplus(``lam``); ``lam`` stores the pre-image (requires ``lam_init > 0``).
"""

from __future__ import annotations

import math

import torch


class NoConstraint:
    name = "none"

    def raw_from_value(self, value: float) -> float:
        return value

    def value(self, lam: torch.nn.Parameter) -> torch.Tensor:
        return lam


class ClampConstraint:
    name = "clamp"

    def raw_from_value(self, value: float) -> float:
        if value < 0:
            raise ValueError(f"lam_init={value} violates lam_constraint='clamp' (λ >= 0); use lam_init >= 0")
        return value

    def value(self, lam: torch.nn.Parameter) -> torch.Tensor:
        with torch.no_grad():
            lam.clamp_(min=0.0)
        return lam


class SoftplusConstraint:
    name = "softplus"

    def raw_from_value(self, value: float) -> float:
        if value <= 0:
            raise ValueError(
                f"lam_init={value} is unreachable with lam_constraint='softplus' (λ > 0); use lam_init > 0"
            )
        return value + math.log(-math.expm1(-value))  # inverse softplus, stable for large values

    def value(self, lam: torch.nn.Parameter) -> torch.Tensor:
        return torch.nn.functional.softplus(lam)


LAMBDA_CONSTRAINTS = {c.name: c for c in (NoConstraint(), ClampConstraint(), SoftplusConstraint())}


def get_constraint(name: str):
    try:
        return LAMBDA_CONSTRAINTS[name]
    except KeyError:
        raise ValueError(
            f"unknown lam_constraint {name!r}; choose one of: {', '.join(sorted(LAMBDA_CONSTRAINTS))}"
        ) from None
