"""STk's default ``lam_update="track"``: a training call uses the λ the previous call stepped to, and
the one pass that gives the value gives the next step. Checked against float64 references: the value
and gradient are Eq. 6's at the stored λ (autograd of the formula), the stored λ moves by exactly one
step of the solver, repeated calls on one batch reach the solver's root, and both paths (the C++ lane
and the batched torch path) keep to this. MATk's count has no slope to step on: it steps by the counts
in a window around λ, and tracks drifting batches to a few losses."""

import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate.kernels import native_ready
from topklab.losses.aggregate.solve import solve_srelu_threshold, srelu_threshold_step

PATHS = ["native", "eager"] if native_ready(torch.zeros(1), "testing the eager path only") else ["eager"]


def eq6(losses: torch.Tensor, lam: float, k: int, delta: float) -> torch.Tensor:
    """STk's Eq. 6 written out: (1/n)·Σ SReLU_δ(ℓ − λ) + (k/n)·λ, SReLU(x) = ½(x + √(x²+δ²) − δ)."""
    x = losses - lam
    return (0.5 * (x + torch.sqrt(x * x + delta * delta) - delta)).mean() + k / losses.numel() * lam


@pytest.mark.parametrize("kernel", PATHS)
def test_a_track_call_is_eq6_at_the_stored_lambda_and_stores_one_solver_step(kernel):
    generator = torch.Generator().manual_seed(3)
    loss = STk(
        k=0.25, lam_update="track", delta=0.05, kernel=kernel
    )  # float32 buffers: float64 losses take the C++ lane
    loss(torch.rand(200, generator=generator, dtype=torch.float64).requires_grad_())  # the first call solves
    for step in range(6):
        losses = (torch.rand(200, generator=generator, dtype=torch.float64) * 3 - 0.2 * step).requires_grad_()
        used = float(loss.lam_last)
        value = loss(losses)
        value.backward()
        reference = losses.detach().clone().requires_grad_()
        want = eq6(reference, used, 50, 0.05)
        want.backward()
        torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(losses.grad, reference.grad, rtol=1e-12, atol=1e-14)
        one = torch.ones(1, dtype=torch.float64)
        stepped, _ = srelu_threshold_step(losses.detach()[None], 50 * one, 0.05 * one, used * one)
        assert float(loss.lam_last) == pytest.approx(float(stepped), rel=1e-6)  # the buffer is float32


@pytest.mark.parametrize("kernel", PATHS)
def test_calls_on_one_batch_reach_the_solvers_float64_root(kernel):
    generator = torch.Generator().manual_seed(4)
    losses = torch.randn(5000, generator=generator, dtype=torch.float64).exp()
    loss = STk(k=0.1, lam_update="track", delta=0.01, lam_init=0.0, solve_steps=1, kernel=kernel)
    for _ in range(12):
        loss(losses.clone().requires_grad_())
    one = torch.ones(1, dtype=torch.float64)
    root, count = solve_srelu_threshold(losses[None], 500 * one, 0.01 * one, one, steps=60)
    assert float(count) == pytest.approx(500, abs=1e-6)
    assert float(loss.lam_last) == pytest.approx(float(root), rel=1e-6)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("n", [1_000, 100_000])
@pytest.mark.parametrize("layout", ["1-D, the C++ lane", "(1, n), the torch path"])
def test_a_tracked_lambda_stays_at_the_root_of_an_unchanging_batch(dtype, n, layout, offset):
    """The same batch call after call (full-batch training): the tracked λ settles at the batch's root
    and stays there, every call in band. A step below half λ's resolution rounds ``λ + step`` back to
    λ, which the bracket test took for a step out of the bracket and bisected: in float32 the C++ lane
    went to the bracket's midpoint (0.44 for a root at 0.90) on every fifth call, and the torch path
    (a GPU's) every third call where the losses lie near 1000 (λ's resolution is coarser there)."""
    losses = offset + torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=dtype)
    leaf = (losses if layout.startswith("1-D") else losses[None]).clone().requires_grad_()
    loss = STk(k=0.1, lam_update="track")
    seen = []
    for _ in range(30):
        loss(leaf).sum().backward()
        seen.append(float(loss.lam_last.reshape(-1)[0]))
    diagnostics = loss.monitor.pop_epoch()
    assert max(seen[5:]) - min(seen[5:]) <= 4 * torch.finfo(torch.float32).eps, seen
    assert diagnostics["lam_in_band_all"] == 1.0, diagnostics


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_a_delta_below_lambdas_resolution_does_not_hold_lambda_on_tied_losses(scale):
    """The rule above keeps λ where the step rounds back to it only where δ is at least λ's resolution:
    with a smaller δ, losses tied at λ make the count jump within one step of λ, and a short step there
    says nothing of the root. 100 losses tied at λ, the root at twice λ: both paths leave the tie for
    the root (they held λ there, 140 losses above it for k = 50, before the guard; a second read found it)."""

    def batch(top: int) -> torch.Tensor:  # top losses at 2c, 100 at c, the rest at 0
        return torch.cat([torch.full((top,), 2 * scale), torch.full((100,), scale), torch.zeros(900 - top)])

    paths = []
    for layout in ("1-D", "(1, n)"):
        loss = STk(k=0.05, lam_update="track", delta=1e-8 * scale)
        for call in range(25):
            losses = batch(20 if call < 5 else 90)  # the first batch's root is at c, the second's at 2c
            loss((losses if layout == "1-D" else losses[None]).requires_grad_()).sum().backward()
        paths.append(float(loss.lam_last.reshape(-1)[0]))
    assert paths[0] == paths[1], paths
    assert paths[0] == pytest.approx(2 * scale, rel=1e-5), paths


def test_a_batch_with_a_nan_loss_leaves_lambda_and_counts_out_of_band():
    loss = STk(k=0.5, lam_update="track")
    loss(torch.rand(32, requires_grad=True))
    before = (float(loss.lam), float(loss.lam_last))
    losses = torch.rand(32)
    losses[7] = float("nan")
    value = loss(losses.requires_grad_())
    assert value.isnan() and (float(loss.lam), float(loss.lam_last)) == before
    assert loss.monitor.pop_epoch()["lam_in_band_all"] == 0.5  # the NaN call is out of band


@pytest.mark.parametrize("kernel", PATHS)
def test_infinite_losses_keep_lambda_finite_and_inside_the_finite_range(kernel):
    loss = STk(k=0.5, lam_update="track", kernel=kernel)
    generator = torch.Generator().manual_seed(6)
    for _ in range(4):
        losses = torch.rand(64, generator=generator)
        losses[:3] = float("inf")
        losses[3:5] = float("-inf")
        assert loss(losses.requires_grad_()).isinf()
        lam = float(loss.lam_last)
        assert 0.0 <= lam <= 1.0, lam


def test_rows_each_track_their_own_lambda_as_the_one_row_module_does():
    generator = torch.Generator().manual_seed(7)
    batches = [torch.rand(3, 40, generator=generator, dtype=torch.float64) * (3 + i) for i in range(4)]
    rows = STk(k=0.3, lam_update="track", kernel="eager", rows=3)
    singles = [STk(k=0.3, lam_update="track", kernel="eager") for _ in range(3)]
    for batch in batches:
        values = rows(batch)
        for p, single in enumerate(singles):
            torch.testing.assert_close(values[p], single(batch[p]), rtol=1e-6, atol=1e-6)
            assert float(rows.lam_last[p]) == float(single.lam_last)


@pytest.mark.parametrize("kernel", PATHS)
def test_matk_tracks_the_kth_largest_loss_of_drifting_batches_within_a_few_losses(kernel):
    """MATk's window step: on batches that drift by 0.5 % of their spread per call, the λ each call
    uses has k of the batch's losses above it, less the one call's lag, to sampling noise (4 std per
    call, 3 std of the mean),
    the loss is Eq. 5 at that λ, and on a batch that stops moving λ reaches MATk's root interval
    [ℓ_[k+1], ℓ_[k]) exactly."""
    generator = torch.Generator().manual_seed(8)
    loss = MATk(k=0.1, lam_update="track", kernel=kernel)  # float32 buffers: float64 losses take the C++ lane
    above = []
    for step in range(60):
        losses = (torch.rand(4000, generator=generator, dtype=torch.float64) * 4 - 0.02 * step).requires_grad_()
        used = float(loss.lam_last)
        value = loss(losses)
        if step > 0:
            above.append(int((losses > used).sum()))
            want = torch.relu(losses.detach() - used).mean() + 0.1 * used
            torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
    # a stale λ on a fresh batch: the count above it is binomial, std √(4000·0.1·0.9) ≈ 19, around
    # k less the lag: the losses fall 0.02 a call at 1,000 losses a unit, so 20 fewer lie above
    counted = above[5:]
    assert all(300 <= a <= 460 for a in counted) and abs(sum(counted) / len(counted) - 380) < 8, above
    for _ in range(15):
        loss(losses.detach().clone().requires_grad_())
    descending = losses.detach().sort(descending=True).values
    assert descending[400] <= float(loss.lam_last) < descending[399]


def test_matk_track_keeps_a_window_and_the_bad_settings_stay_errors():
    loss = MATk(k=0.5, lam_update="track")
    assert list(loss.state_dict()) == ["lam", "lam_last", "lam_width", "lam_started"]
    assert "lam_width" not in dict(STk(k=0.5).named_buffers()) and "lam_width" not in dict(
        MATk(k=0.5, lam_update="solve").named_buffers()
    )
    with pytest.raises(ValueError, match="lam_lr applies to lam_update='gradient'; with lam_update='track'"):
        MATk(k=0.5, lam_update="track", lam_lr=0.1)
    old = {name: value for name, value in loss.state_dict().items() if name != "lam_width"}  # saved before MATk tracked
    loss.load_state_dict(old)
    assert float(loss.lam_width) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matk_never_stores_an_infinite_window(dtype):
    """float32 buffers: a window of float64 losses beyond float32's range is not stored (as inf)."""
    for kernel in PATHS:
        loss = MATk(k=3, lam_update="track", kernel=kernel)
        loss(torch.linspace(0, 1, 30, dtype=dtype).requires_grad_())
        loss(torch.cat([torch.full((15,), -3e38), torch.full((15,), 3e38)]).to(dtype).requires_grad_())
        if dtype == torch.float64:
            wide = torch.full((30,), 1e300, dtype=dtype) * torch.arange(30, dtype=dtype).sub(14.5).sign()
            loss(wide.requires_grad_())
        assert torch.isfinite(loss.lam_width), (kernel, dtype)


@pytest.mark.skipif(PATHS == ["eager"], reason="the C++ lane is not built here")
def test_a_step_from_far_above_the_losses_is_the_same_on_both_paths():
    """λ far above float32 losses (z ≪ −δ): the count's terms δ²/(4z²) lie below the rounding of
    ½(1 + z/r), so the lane sums them in the accurate form, as the torch path does; before, the two
    stepped to 3.16 and 4.17."""
    losses = torch.tensor([3.866, 1.298, 4.570, 4.667, 1.377])
    stepped = []
    for kernel in PATHS:
        loss = STk(k=1, lam_update="track", delta=1e-3, kernel=kernel)
        loss(losses.clone().requires_grad_())
        loss.lam_last.fill_(8.0)
        loss(losses.clone().requires_grad_())
        stepped.append(float(loss.lam_last))
    assert stepped[0] == pytest.approx(stepped[1], rel=1e-5) and 4.0 < stepped[0] < 8.0
