"""Which temperatures are scale-free and which are in score units, for every
configured operator (``configs/operator/*.yaml``) on seeded float64 scores (batch 4, n = 12, k = 3).

For c in {0.1, 10} and p = ``soft_topk(scores, k)`` at the config's temperature T:

- scale-free: p(c·s) ≈ p(s) with T unchanged;
- score units (power e): p(c·s) ≠ p(s), but p(c·s) with T·c^e ≈ p(s) (e = 1 for a width, e = −1/2
  for the sorting networks' steepness β under logistic_phi with λ = 1/2, whose comparator
  σ(β·v/|v|^λ) sees β·c^(1−λ));
- neither (``soft_topk_ot``): its normalised cost is measured from fixed anchors 0 and 1, so p(c·s)
  ≠ p(s) and no power of c on ε restores it. Tested instead: its exact invariance (s → −1 − s with
  k → n − k gives 1 − p) and its two limits (ε ∝ the scale for |s| ≪ 1, ∝ 1/scale for |s| ≫ 1).

The table in ``docs/operators-measured.md`` ("Temperatures: scale and n") states the same classes."""

import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONFIG_DIR
from topklab.engine.build import build

pytestmark = pytest.mark.filterwarnings("ignore:SinkhornSort did not converge")
NAMES = sorted(path.stem for path in (CONFIG_DIR / "operator").glob("*.yaml"))
NETWORK = ("odd_even", "bitonic", "splitter_selection", "difftopk_network")
# config -> (temperature key, e): p(c·s) at T·c^e equals p(s) at T; e = None: scale-free
UNITS = {
    **{name: ("steepness", -0.5) for name in NETWORK},  # β·c^(λ − 1), λ = art_lambda = 0.5
    "neuralsort": ("tau", 1.0),
    "softsort": ("tau", 1.0),  # τ·c^power, power = 1
    "lapsum": ("alpha", 1.0),
    "dftopk": ("temperature", 1.0),
    "sparse_topk": ("regularization", 1.0),
    "perturbed": ("sigma", 1.0),
    "stk_threshold": ("delta", 1.0),
    "sinkhorn": ("inverse_temperature", None),  # scores standardised before the cost
    "soft_topk_ot": ("epsilon", "neither"),
}
FACTORS = (0.1, 10.0)
K = 3


def operator(name: str, factor: float = 1.0):
    """The configured operator with its temperature times ``factor`` (and a fixed seed where it draws noise)."""
    node = OmegaConf.load(CONFIG_DIR / "operator" / f"{name}.yaml")
    key = UNITS[name][0]
    node[key] = float(node[key]) * factor
    if "seed" in node:
        node.seed = 0  # a fresh generator per operator: the same standard normal draws in every call
    return build(node, "operator")


def scores() -> torch.Tensor:
    generator = torch.Generator().manual_seed(31)
    return torch.randn(4, 12, generator=generator, dtype=torch.float64)


def soft_topk(name: str, values: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    return operator(name, factor).soft_topk(values, K)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_every_config_is_classified():
    assert sorted(UNITS) == NAMES
    for name in NETWORK:  # the steepness exponent −(1 − λ) assumes logistic_phi with λ = 1/2
        node = OmegaConf.load(CONFIG_DIR / "operator" / f"{name}.yaml")
        assert (node.distribution, node.art_lambda) == ("logistic_phi", 0.5)
    assert OmegaConf.load(CONFIG_DIR / "operator" / "softsort.yaml").power == 1.0


@pytest.mark.parametrize("name", [name for name in NAMES if UNITS[name][1] is None])
@pytest.mark.parametrize("c", FACTORS)
def test_scale_free_temperature(name, c):
    s = scores()
    assert gap(soft_topk(name, c * s), soft_topk(name, s)) < 1e-9


@pytest.mark.parametrize("name", [name for name in NAMES if isinstance(UNITS[name][1], float)])
@pytest.mark.parametrize("c", FACTORS)
def test_temperature_in_score_units(name, c):
    s, power = scores(), UNITS[name][1]
    reference = soft_topk(name, s)
    assert gap(soft_topk(name, c * s), reference) > 1e-3  # the scale alone changes p
    # the temperature moved with the scores restores it (the STk solver stops at a relative tolerance)
    assert gap(soft_topk(name, c * s, c**power), reference) < 1e-8


@pytest.mark.parametrize("c", FACTORS)
def test_soft_topk_ot_follows_neither_class(c):
    s = scores()
    reference = soft_topk("soft_topk_ot", s)
    for power in (None, 1.0, 2.0, -1.0, -2.0):  # unchanged ε, and ε times c, c², 1/c, 1/c²
        assert gap(soft_topk("soft_topk_ot", c * s, 1.0 if power is None else c**power), reference) > 1e-3


def test_soft_topk_ot_is_invariant_to_the_reflection_that_swaps_its_anchors():
    # points −s go to anchors 0 (mass k/n) and 1; s' = −1 − s puts every point at its old distance
    # from the other anchor, so p(s', n − k) = 1 − p(s, k) (Γ's columns swap, the normaliser is the same)
    # (run to convergence, tol = 0, so that the stopping round does not differ between the two)
    node = OmegaConf.merge(
        OmegaConf.load(CONFIG_DIR / "operator" / "soft_topk_ot.yaml"), {"tol": 0.0, "max_iter": 2000}
    )
    s, n, op = scores(), 12, build(node, "operator")
    assert gap(op.soft_topk(-1.0 - s, n - K), 1.0 - op.soft_topk(s, K)) < 1e-10


@pytest.mark.parametrize(("c", "power"), [(1e-4, 1.0), (1e4, -1.0)])
def test_soft_topk_ot_limits_are_score_units_with_opposite_directions(c, power):
    # |c·s| ≪ 1: the normaliser is the anchor distance 1, so cost differences are 2c·(s_i − s_j) and
    # ε ∝ the score scale; |c·s| ≫ 1: the normaliser is ≈ c·max|s|, the two anchors' costs differ by
    # ≈ 2·s_i/(c·max|s|²), so ε ∝ 1/scale. Both limits are near the uniform k/n: compare with how far p is from it.
    s = scores()
    reference = soft_topk("soft_topk_ot", c * s)
    spread = float((reference - K / 12).abs().max())
    assert gap(soft_topk("soft_topk_ot", 10 * c * s), reference) > 0.05 * spread
    assert gap(soft_topk("soft_topk_ot", 10 * c * s, 10.0**power), reference) < 0.01 * spread
