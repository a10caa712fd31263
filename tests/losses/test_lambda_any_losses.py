"""λ in band on any losses, not only the benchmark's: the default rule (``adaptive``) and ``track`` as
properties over generated i.i.d. streams (uniform, exponential, log-normal and Pareto losses with a tail
index from 1.1 to 3, scaled by 1e-3 … 1e4 and shifted, rows of a few to 4,096 losses; 8,192 in the slow
tier), and the cases that were found out of band as named tests.

A call is in band where the smoothed share above the λ it used lies within a factor 2 of k/n and its
complement within a factor 2 of 1 − k/n (:mod:`~topklab.losses.aggregate.lambda_monitor`). A tracked λ
is one call behind, so on i.i.d. batches the share at it spreads as the count of a fresh batch above a
fixed λ does: with fewer than about 32 losses on either side of the k-th (k or n − k below 32) no λ keeps
that count within a factor 2 on 0.9 of the calls, and the properties leave tracked rows with so few out."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from topklab.losses import MATk, STk
from topklab.losses.aggregate.lambda_rules import Adaptive

AGGREGATES = {"STk": STk, "MATk": MATk}
FEWEST_ON_A_SIDE = 32  # a tracked row needs k and n − k at least this (see the module docstring)


def draw(shape: str, n: int, generator: torch.Generator, alpha: float = 2.0) -> torch.Tensor:
    """n i.i.d. float64 losses of ``shape``: "uniform" U(0, 1), "exponential" Exp(1), "lognormal"
    exp(N(0, 1)), "pareto" Pareto(α) from 1, "ties" four tied values {0, 1, 2, 3}."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if shape == "uniform":
        return u
    if shape == "exponential":
        return -torch.log1p(-u)
    if shape == "lognormal":
        return torch.randn(n, generator=generator, dtype=torch.float64).exp()
    if shape == "pareto":
        return (1.0 - u).pow(-1.0 / alpha)
    if shape == "ties":
        return torch.floor(4 * u)
    raise ValueError(shape)


def in_band_share(module, shape, n, calls, seed, scale=1.0, shift=0.0, alpha=2.0, dtype=torch.float32) -> float:
    """The share of a fresh module's training calls in band after the burn-in (the first tenth) on
    ``calls`` i.i.d. batches of n losses (1-D, as a user's batch of per-sample losses)."""
    generator = torch.Generator().manual_seed(seed)
    module.monitor.burn_in = calls // 10
    for _ in range(calls):
        losses = (draw(shape, n, generator, alpha) * scale + shift).to(dtype).requires_grad_()
        module(losses).backward()
    return module.monitor.pop_epoch()["lam_in_band"]


def tracked(name: str, rule: str, n: int) -> bool:
    """Whether ``rule`` tracks λ on rows of n losses of aggregate ``name`` (``adaptive``: from its
    ``track_from``)."""
    smoothing = "srelu" if name == "STk" else "relu"
    return rule == "track" or (rule == "adaptive" and n >= Adaptive.TRACK_FROM[smoothing])


@st.composite
def streams(draw_from, largest_n: int, longest: int):
    """An i.i.d. stream: (aggregate, rule, shape, α, n, k, scale, shift, calls, seed)."""
    name = draw_from(st.sampled_from(sorted(AGGREGATES)))
    rule = draw_from(st.sampled_from(["adaptive", "track"]))
    shape = draw_from(st.sampled_from(["uniform", "exponential", "lognormal", "pareto"]))
    alpha = draw_from(st.floats(1.1, 3.0))
    fewest = 2 * FEWEST_ON_A_SIDE if rule == "track" else 2
    n = draw_from(st.integers(fewest, largest_n))
    if tracked(name, rule, n):
        k = draw_from(st.integers(FEWEST_ON_A_SIDE, n - FEWEST_ON_A_SIDE))
    else:
        k = draw_from(st.integers(1, n - 1))
    scale = 10.0 ** draw_from(st.floats(-3.0, 4.0))
    shift = scale * draw_from(st.floats(-10.0, 10.0))
    calls = draw_from(st.integers(40, longest))
    seed = draw_from(st.integers(0, 2**16))
    return name, rule, shape, alpha, n, k, scale, shift, calls, seed


def holds_in_band(name, rule, shape, alpha, n, k, scale, shift, calls, seed) -> None:
    module = AGGREGATES[name](k, lam_update=rule)
    share = in_band_share(module, shape, n, calls, seed, scale, shift, alpha)
    assert share >= 0.9, (name, rule, shape, alpha, n, k, scale, shift, calls, seed, share)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(stream=streams(largest_n=4096, longest=100))
def test_the_default_rule_and_track_are_in_band_on_any_iid_stream(stream):
    """At any scale and shift of the losses (δ = 0.01 fixed: from far larger than their spread to far
    smaller), both rules keep λ in band on at least 0.9 of a stream's calls after its burn-in. Before
    the tracked step was bounded in units of the losses' own spacing, a bracket-midpoint step threw λ
    across the losses wherever δ was small against their spacing."""
    holds_in_band(*stream)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(stream=streams(largest_n=8192, longest=200))
def test_the_default_rule_and_track_are_in_band_on_any_iid_stream_on_many_more_draws(stream):
    holds_in_band(*stream)


# The probe that found the tracked λ out of band: a fresh module, i.i.d. calls, the smoothed share at the
# λ used (MATk on ties: the monitor's figure); named (aggregate, losses, n, k/n, rule).
TABLE = {
    "stk_uniform_300_n2048_k0.1": ("STk", "uniform", 300.0, 2048, 0.1, "adaptive"),
    "stk_uniform_300_n2048_k0.9": ("STk", "uniform", 300.0, 2048, 0.9, "adaptive"),
    "stk_uniform_3000_n2048_k0.1": ("STk", "uniform", 3000.0, 2048, 0.1, "adaptive"),
    "stk_uniform_3000_n2048_k0.9": ("STk", "uniform", 3000.0, 2048, 0.9, "adaptive"),
    "stk_uniform_3000_n256_k0.9_solved_two_steps": ("STk", "uniform", 3000.0, 256, 0.9, "adaptive"),
    "stk_exponential_mean30_n4096_k0.1": ("STk", "exponential", 30.0, 4096, 0.1, "adaptive"),
    "stk_pareto1.1_n4096_k0.1_tracked": ("STk", "pareto", 1.0, 4096, 0.1, "track"),
    "matk_pareto1.1_n256_k0.9": ("MATk", "pareto", 1.0, 256, 0.9, "adaptive"),
    "matk_pareto1.1_n1024_k0.9": ("MATk", "pareto", 1.0, 1024, 0.9, "adaptive"),
    "matk_pareto1.1_n4096_k0.9": ("MATk", "pareto", 1.0, 4096, 0.9, "adaptive"),
}
NEAR_MISSES = {
    "stk_exponential_mean10_n4096_k0.1": ("STk", "exponential", 10.0, 4096, 0.1, "adaptive"),
    "stk_uniform_30_n2048_k0.9": ("STk", "uniform", 30.0, 2048, 0.9, "adaptive"),
    "stk_pareto1.1_n2048_k0.1": ("STk", "pareto", 1.0, 2048, 0.1, "adaptive"),
}
STK_TIES = {
    "stk_four_ties_n2048_k0.5": ("STk", "ties", 1.0, 2048, 0.5, "adaptive"),
    "stk_four_ties_n4096_k0.5": ("STk", "ties", 1.0, 4096, 0.5, "adaptive"),
}


@pytest.mark.parametrize("case", [*TABLE, *NEAR_MISSES, *STK_TIES])
def test_each_case_the_probe_found_out_of_band_is_in_band(case):
    """Each row the probe found out of band (0.27 – 0.84 of 400 calls), and each near miss (0.89),
    on 200 calls of the same losses: at least 0.9 in band after the burn-in."""
    name, shape, scale, n, fraction, rule = {**TABLE, **NEAR_MISSES, **STK_TIES}[case]
    module = AGGREGATES[name](fraction, lam_update=rule)
    share = in_band_share(module, shape, n, 200, seed=0, scale=scale, alpha=1.1)
    assert share >= 0.9, share


def test_a_tracked_step_is_scale_free():
    """The same stream at any scale and shift (δ scaled with the losses, float64): the tracked λ is the
    same up to the scale and shift, to rounding; the bound on the step is in units of the losses' spacing."""
    seen = []
    for scale, shift in ((1.0, 0.0), (1e3, -5e2), (1e-2, 7.0)):
        module = STk(0.1, delta=0.01 * scale, lam_update="track")
        generator = torch.Generator().manual_seed(5)
        lams = []
        for _ in range(30):
            module(draw("uniform", 2048, generator).mul(scale).add(shift).requires_grad_()).backward()
            lams.append((float(module.lam_last) - shift) / scale)
        seen.append(lams)
    for other in seen[1:]:
        assert max(abs(a - b) for a, b in zip(seen[0], other)) < 1e-4 * max(map(abs, seen[0])), (seen[0][:5], other[:5])
    assert math.isfinite(seen[0][-1])
