"""The one-row lane of MATk/STk (``ThresholdedTopK._one_row``: one C++ call per module call on 1-D
float32/float64 CPU losses on the native path) against the general path it stands in for: the same
values, gradients, stored λ and monitor sums, bit for bit, call after call (the monitor's smoothed
share under lam_update="gradient" to rounding: it is the kernel's own sum there). Under
lam_update="track" the lane's one pass sums in blocks where the general path sums with torch, so
values and gradients agree to rounding (1e-4 relative in float32, 1e-12 in float64), and so does λ in
float64; in float32 a step from where the count is flat in λ (between two losses δ apart) divides the
count's rounding by a slope near 0, so λ may land elsewhere on that flat stretch, where the value and
the gradient do not depend on it."""

from __future__ import annotations

import copy

import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate.kernels import native_ready
from topklab.losses.aggregate.thresholded import ThresholdedTopK

pytestmark = pytest.mark.skipif(
    not native_ready(torch.zeros(1), "skipping the one-row lane's tests"), reason="no native kernel here"
)

CASES = {
    "stk_solve": lambda: STk(k=0.7, delta=0.05, lam_update="solve", kernel="native"),
    "stk_solve_fixed_start": lambda: STk(
        k=5, delta=0.01, lam_init=0.5, lam_momentum=0.3, lam_update="solve", kernel="native"
    ),
    "stk_solve_atk_scale": lambda: STk(k=0.3, delta=0.05, scale="atk", lam_update="solve", kernel="native"),
    "stk_track": lambda: STk(k=0.7, delta=0.05, lam_update="track", kernel="native"),
    "stk_auto": lambda: STk(k=0.7, delta=0.05, kernel="native"),
    "stk_track_fixed_start": lambda: STk(
        k=5, delta=0.01, lam_init=0.5, lam_momentum=0.3, lam_update="track", kernel="native"
    ),
    "stk_track_atk_scale": lambda: STk(k=0.3, delta=0.05, scale="atk", lam_update="track", kernel="native"),
    "matk_solve": lambda: MATk(k=0.25, lam_update="solve", kernel="native"),
    "matk_solve_atk": lambda: MATk(k=7, lam_update="solve", scale="atk"),
    "matk_track": lambda: MATk(k=0.25, lam_update="track", kernel="native"),
    "matk_auto": lambda: MATk(k=0.25, kernel="native"),
    "matk_track_atk": lambda: MATk(k=7, lam_update="track", scale="atk"),
    "stk_gradient": lambda: STk(k=0.7, delta=0.05, lam_update="gradient", kernel="native"),
    "stk_gradient_softplus": lambda: STk(
        k=0.3, delta=0.05, lam_update="gradient", lam_init=1.0, lam_constraint="softplus", scale="atk", kernel="native"
    ),
    "matk_gradient_atk": lambda: MATk(k=0.25, lam_update="gradient", scale="atk", kernel="native"),
    "stk_auto_long_rows": lambda: STk(k=0.9, compile_min_n=16),
}


class Counting:
    """Counts the calls of ``_one_row`` that took the lane (returned a value)."""

    def __init__(self, monkeypatch):
        self.taken = 0
        original = ThresholdedTopK._one_row

        def counted(module, losses):
            value = original(module, losses)
            self.taken += value is not None
            return value

        monkeypatch.setattr(ThresholdedTopK, "_one_row", counted)


def run(module, batches, lane: bool):
    """Training and evaluation calls, each with a backward; what each call gives and leaves."""
    if not lane:
        module._one_row = lambda losses: None
    module.monitor.sample_every = 3  # the monitor's samples (hard share, λ − ℓ_[k]) on calls 1, 4, 7, 10
    params = [p for p in module.parameters()]
    records = []
    for step, losses in enumerate(batches):
        module.train(step % 4 != 3)
        leaf = losses.repeat_interleave(2).requires_grad_() if step % 3 == 2 else losses.clone().requires_grad_()
        x = leaf[::2] if step % 3 == 2 else leaf  # every third call on a strided view
        value = module(x)
        (value * (1.0 if step % 2 else 3.0)).backward()
        records.append(
            {
                "value": value.detach().clone(),
                "grad": leaf.grad.clone(),
                "lam_grad": [p.grad.clone() for p in params if p.grad is not None],
                "buffers": [b.clone() for b in module.buffers()],
                "lam": module.lam.detach().clone(),
                "state": module.monitor._state.clone(),
                "calls": module.monitor.calls,
            }
        )
        for p in params:
            with torch.no_grad():
                p -= 0.1 * p.grad
            p.grad = None
    return records


LANE_CASES = [
    (case, dtype)
    for case in sorted(CASES)
    for dtype in (torch.float32, torch.float64)
    if dtype == torch.float64 or "track" not in case and case != "stk_auto_long_rows"
]


@pytest.mark.parametrize(("case", "dtype"), LANE_CASES, ids=[f"{c}-{str(d)[6:]}" for c, d in LANE_CASES])
def test_the_one_row_lane_equals_the_general_path(case, dtype, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    n = 64
    batches = [(torch.rand(n, generator=generator, dtype=dtype) * (3 - 0.2 * i)).exp() for i in range(12)]
    batches[5][7] = batches[5][9]  # ties
    lane_module = CASES[case]()
    general_module = copy.deepcopy(lane_module)
    counter = Counting(monkeypatch)
    lane = run(lane_module, batches, lane=True)
    assert counter.taken == len(batches) - 1, "every call but the first (which starts λ) takes the lane"
    general = run(general_module, batches, lane=False)
    share_to_rounding = lane_module.lam_update == "gradient"
    tolerance = 1e-12 if lane_module.lam_update == "track" else 0.0
    for step, (a, b) in enumerate(zip(lane, general)):
        for key in ("value", "grad", "calls"):
            close(a[key], b[key], tolerance, (step, key))
        assert all(torch.equal(x, y) for x, y in zip(a["lam_grad"], b["lam_grad"])), (step, "lam_grad")
        close(a["lam"], b["lam"], tolerance, (step, "lam"))
        for x, y in zip(a["buffers"], b["buffers"]):
            close(x, y, tolerance, (step, "buffers"))
        if tolerance:
            torch.testing.assert_close(a["state"], b["state"], rtol=1e-9, atol=1e-9, msg=str((step, "monitor")))
        elif share_to_rounding:
            share = 1  # state = [calls, share_sum, ...]: the share sum to rounding, every count exact
            assert torch.allclose(a["state"][share], b["state"][share], rtol=1e-6, atol=0), step
            rest = [i for i in range(a["state"].numel()) if i != share]
            assert torch.equal(a["state"][rest], b["state"][rest]), (step, "monitor counts")
        else:
            assert torch.equal(a["state"], b["state"]), (step, "monitor")


@pytest.mark.parametrize(
    "case", ["stk_track", "stk_track_fixed_start", "stk_track_atk_scale", "stk_auto_long_rows", "matk_track"]
)
def test_a_float32_track_call_in_the_lane_equals_the_general_paths_from_the_same_state(case):
    """Call by call from the lane module's state: the same value, gradient and smoothed share (1e-4),
    and a next λ at which the batch's smoothed count is the same (to 1e-3 of k)."""
    generator = torch.Generator().manual_seed(1)
    lane_module = CASES[case]()
    for i in range(12):
        losses = (torch.rand(64, generator=generator) * (3 - 0.2 * i)).exp()
        general_module = copy.deepcopy(lane_module)
        general_module._one_row = lambda losses: None
        used = lane_module.lam_last.clone()
        (value, grad), (want, want_grad) = (value_and_grad(m, losses) for m in (lane_module, general_module))
        torch.testing.assert_close(value, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(lane_module.monitor._state[1], general_module.monitor._state[1], rtol=1e-5, atol=0)
        if i > 0:  # the first call solves on the general path in both
            count = lane_module.k if isinstance(lane_module.k, int) else lane_module.k * 64
            counts = [
                lane_module._row_shares(losses[None].double(), lam.double().view(1))[0] * 64
                for lam in (lane_module.lam_last, general_module.lam_last)
            ]
            assert abs(float(counts[0] - counts[1])) < 1e-3 * count, (i, used, counts)


def value_and_grad(module, losses):
    leaf = losses.clone().requires_grad_()
    value = module(leaf)
    value.backward()
    return value.detach(), leaf.grad


def close(a, b, tolerance: float, where) -> None:
    """Bit for bit where ``tolerance`` is 0, else to that tolerance (relative and absolute; float32
    λ buffers of a float64 run: 1e-6)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if tolerance == 0.0:
        assert torch.equal(a, b), where
    else:
        scale = max(tolerance, 1e-6) if a.dtype == torch.float32 else tolerance
        torch.testing.assert_close(a, b, rtol=scale, atol=scale, msg=str(where))


def test_the_lane_leaves_other_inputs_to_the_general_path(monkeypatch):
    counter = Counting(monkeypatch)
    module = STk(k=0.5, kernel="native")
    for losses in (torch.rand(8), torch.rand(8), torch.rand(2, 8), torch.rand(16)[::2], torch.rand(8).half()):
        module(losses.requires_grad_() if losses.is_floating_point() else losses).sum().backward()
    assert counter.taken == 2, "only the second and the strided 1-D float32/float64 calls take the lane"
    assert STk(k=0.5, compile_min_n=16).path_for(torch.zeros(1, 8)) == "eager", "kernel=auto below compile_min_n"
    assert STk(k=0.5).path_for(torch.zeros(1, 8)) == "native", "by default the C++ kernel at every n on a CPU"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [5, 0.3, 69_990])
def test_matk_on_long_rows_selects_the_general_paths_kth_largest(k, dtype, monkeypatch):
    """From 65,536 losses on, the lane selects ℓ_[k] among the losses of its histogram bucket
    (``kth_in_range``): the general path's λ (``torch.kthvalue``) bit for bit, value and gradient
    too, with ties, negative losses, both zeros and (in the last batch) infinities."""
    generator = torch.Generator().manual_seed(1)
    n = 70_000
    batches = []
    for step in range(4):
        losses = torch.randn(n, generator=generator, dtype=dtype).mul(3)
        losses[200:20_000] = losses[20_000:39_800]  # ties: most losses twice
        losses[:50], losses[50:100] = 0.0, -0.0
        if step == 3:
            losses[100:103], losses[103:105] = float("inf"), -float("inf")
        batches.append(losses[torch.randperm(n, generator=generator)])
    lane_module = MATk(k=k, lam_update="solve", kernel="native")
    general_module = copy.deepcopy(lane_module)
    counter = Counting(monkeypatch)
    lane = run(lane_module, batches, lane=True)
    assert counter.taken == len(batches) - 1
    general = run(general_module, batches, lane=False)
    for step, (a, b) in enumerate(zip(lane, general)):
        for key in ("value", "grad", "lam"):
            assert torch.equal(a[key], b[key]), (step, key)
        assert all(torch.equal(x, y) for x, y in zip(a["buffers"], b["buffers"])), (step, "buffers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matk_on_long_rows_with_nan_losses_keeps_the_general_paths_lambda(dtype):
    """NaN ranks largest (as in kthvalue): with 10 NaN losses of 70,000 the lane's ℓ_[k] is the general
    path's, and both values are NaN."""
    generator = torch.Generator().manual_seed(2)
    batches = [torch.randn(70_000, generator=generator, dtype=dtype) for _ in range(2)]
    batches[1][torch.randperm(70_000, generator=generator)[:10]] = float("nan")
    lane_module = MATk(k=0.3, lam_update="solve", kernel="native")
    general_module = copy.deepcopy(lane_module)
    general_module._one_row = lambda losses: None
    for module in (lane_module, general_module):
        for losses in batches:
            value = module(losses.clone().requires_grad_())
            value.backward()
        assert value.isnan()
    assert torch.equal(lane_module.lam_last, general_module.lam_last)
    assert torch.equal(lane_module.lam, general_module.lam)


def near_lam_cases(dtype):
    """(losses, k, λ) where the lane's sample selects ℓ_[k] near λ (20,000 losses, λ a few losses from
    ℓ_[k] on either side, ties at ℓ_[k]), widens its window (a heavy tail), or selects among all (λ far
    away or above the largest loss, ℓ_[k] among many ties)."""
    generator = torch.Generator().manual_seed(3)
    n, k = 20_000, 2_000
    uniform = torch.rand(n, generator=generator, dtype=dtype)
    ordered = uniform.sort(descending=True).values
    ties = (uniform * 2000).round() / 2000  # about ten losses a value
    heavy = (torch.rand(n, generator=generator, dtype=dtype) * 12).exp()  # sparse near its ℓ_[k]: a wider window
    odd = uniform.clone()
    odd[:7] = float("nan")
    odd[7:10], odd[10:12] = float("inf"), -float("inf")
    return {
        "just_above": (uniform, k, float(ordered[k - 3])),
        "just_below": (uniform, k, float(ordered[k + 4])),
        "at_the_kth": (uniform, k, float(ordered[k - 1])),
        "ties": (ties, k, float(ties.sort(descending=True).values[k - 1])),
        "nan_and_infinite": (odd, k, float(odd[~odd.isnan()].sort(descending=True).values[k - 8])),
        "heavy_tail": (heavy, k, float(heavy.sort(descending=True).values[k - 4])),
        "first": (uniform, 1, float(ordered[1])),
        "last_but_one": (uniform, n - 1, float(ordered[n - 3])),
        "far": (uniform, k, 0.1),
        "above_all": (uniform, k, 2.0),
        "all_equal": (torch.full((n,), 0.5, dtype=dtype), k, 0.5),
        "many_ties": (torch.full((n,), 0.5, dtype=dtype).index_fill(0, torch.arange(0, n, 3), 0.25), k, 0.5),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", sorted(near_lam_cases(torch.float64)))
def test_the_lanes_sample_of_the_kth_loss_equals_the_general_paths(case, dtype):
    """The lane's sample (the hard share above λ, λ − ℓ_[k]) selects ℓ_[k] near the stored λ where it can:
    bit for bit what the general path's torch selection gives, from the same state."""
    losses, k, lam = near_lam_cases(dtype)[case]
    lane_module = STk(k=k, delta=0.01, kernel="native")
    lane_module.monitor.sample_every = 1  # every call samples
    lane_module(losses[~losses.isnan()].clone().requires_grad_())  # starts λ (on the general path)
    lane_module.lam_last.fill_(lam)
    general_module = copy.deepcopy(lane_module)
    general_module._one_row = lambda losses: None
    for module in (lane_module, general_module):
        module(losses.clone().requires_grad_())
    sampled = slice(5, 8)  # the hard share's sum, λ − ℓ_[k]'s sum, the count of samples
    lane, general = lane_module.monitor._state[sampled], general_module.monitor._state[sampled]
    assert general[2] == 2, "the general path sampled the call"
    assert torch.equal(lane, general), (lane, general)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_matks_solve_lane_selects_the_kth_loss_near_its_last_root_as_the_general_path(dtype):
    """MATk's lam_update="solve" lane selects ℓ_[k] near the stored root (a batch of 20,000 losses scaled
    by 1 + 1e-4·i, so the root moves past a few losses a call): the same λ, value and gradient as the
    general path."""
    base = torch.rand(20_000, generator=torch.Generator().manual_seed(4), dtype=dtype)
    batches = [base * (1 + 1e-4 * i) for i in range(5)]
    lane_module = MATk(k=2_000, lam_update="solve", kernel="native")
    general_module = copy.deepcopy(lane_module)
    general_module._one_row = lambda losses: None
    for losses in batches:
        (value, grad), (want, want_grad) = (value_and_grad(m, losses) for m in (lane_module, general_module))
        assert torch.equal(value, want) and torch.equal(grad, want_grad)
        assert torch.equal(lane_module.lam_last, general_module.lam_last)
        assert torch.equal(lane_module.lam, general_module.lam)
