"""λ of MATk/STk tracks the k-th largest loss: the library's defaults in a user's
single-group Adam, the per-batch solver against a float64 root, and the diagnostic that flags
a λ which does not track (the paper's update from λ₀ = 0 or auto at the translation rows' rate)."""

import math
import warnings

import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate import solve
from topklab.losses.aggregate.lambda_monitor import (
    ALL_STEPS,
    LOW_BAND_FLAG,
    PARTLY_TRACKED_FLAG,
    LambdaMonitor,
    flag_for,
    in_band,
    lambda_tracking,
)
from topklab.losses.aggregate.solve import curvature_change, kth_largest, power_law_step, solve_srelu_threshold
from topklab.smoothing import srelu_slope_and_curvature

FLOOR = 1.18  # label smoothing's floor on a token loss (Multi30k: 1.177)


def falling_losses(step: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Token losses in a first epoch: the floor plus Exp(1), shifted by 6 units that fall away over
    the first 200 steps and then settle."""
    shift = 6.0 * max(0.0, 1.0 - step / 200)
    return FLOOR + shift + torch.empty(n).exponential_(1.0, generator=generator)


def floored_static_losses(n: int, generator: torch.Generator) -> torch.Tensor:
    """A static distribution with a floor: N(1, 1) clamped at 1.18 (57 % of the losses tie at the floor)."""
    return torch.clamp(torch.randn(n, generator=generator) + 1.0, min=FLOOR)


def smoothed_share(loss, losses: torch.Tensor) -> float:
    """Σ ∂L/∂ℓ_i read from outside (``scale="paper"``: the smoothed share above λ)."""
    leaf = losses.clone().requires_grad_()
    loss(leaf).backward()
    return float(leaf.grad.sum())


def train_on_stream(loss, steps, n, draw, lr=1e-3, seed=0):
    """A user's loop: one Adam over a dummy model's weight and the loss's parameters; the model
    adds nothing to the losses (they come from ``draw``), so only λ's tracking is measured.
    Returns the smoothed share of each step, read through the gradient."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([weight, *loss.parameters()], lr=lr)
    shares = []
    for step in range(steps):
        losses = (draw(step, n, generator) + 0.0 * weight).detach().requires_grad_()
        optimizer.zero_grad()
        value = loss(losses)
        value.backward()
        shares.append(float(losses.grad.sum()))
        optimizer.step()
    return shares


def band_share(shares, target, skip=0.1):
    counted = shares[int(len(shares) * skip) :]
    return sum(bool(in_band(torch.tensor(s), target)) for s in counted) / len(counted)


def test_library_default_tracks_falling_token_losses_in_training_and_at_evaluation():
    loss = STk(k=0.96)
    shares = train_on_stream(loss, 600, 2048, falling_losses)
    assert band_share(shares, 0.96) >= 0.9
    loss.eval()
    generator = torch.Generator().manual_seed(99)
    held_out = [smoothed_share(loss, falling_losses(600, 2048, generator)) for _ in range(50)]
    assert band_share(held_out, 0.96, skip=0.0) >= 0.9
    assert loss.monitor.pop_epoch()["lam_in_band_all"] >= 0.9


def test_library_default_places_lambda_inside_a_floored_static_distribution():
    loss = STk(k=0.5)
    train_on_stream(loss, 200, 1024, lambda step, n, g: floored_static_losses(n, g))
    generator = torch.Generator().manual_seed(5)
    sample = floored_static_losses(100_000, generator)
    lam = float(loss.eval().threshold)
    assert sample.min() - 0.05 <= lam <= sample.max()
    above = float((sample > lam).double().mean())
    assert 0.25 <= above <= 0.75  # inside: neither Average (everything above λ) nor nothing


@pytest.mark.parametrize("lam_init", [0.0, "auto"])
def test_flag_fires_on_the_paper_update_at_the_translation_rate(lam_init):
    loss = STk(k=0.96, lam_update="gradient", lam_init=lam_init)
    loss.monitor.burn_in = 60
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_on_stream(loss, 600, 2048, falling_losses, lr=5e-4)
    tracking = lambda_tracking([loss.monitor.pop_epoch()])
    assert tracking["in_band"] < 0.5 and tracking["flag"] == LOW_BAND_FLAG
    assert sum("out of band for 100 consecutive" in str(w.message) for w in caught) == 1


def test_flag_does_not_fire_on_the_default():
    loss = STk(k=0.96)
    loss.monitor.burn_in = 60
    train_on_stream(loss, 600, 2048, falling_losses)
    tracking = lambda_tracking([loss.monitor.pop_epoch()])
    assert tracking["in_band"] >= 0.9 and tracking["flag"] is None


def test_solver_reaches_the_float64_root_and_more_steps_are_never_worse():
    generator = torch.Generator().manual_seed(3)
    losses = torch.empty(2, 500, dtype=torch.float64).exponential_(1.0, generator=generator)
    k = torch.tensor([20.0, 400.0], dtype=torch.float64)
    delta = torch.tensor([0.01, 0.2], dtype=torch.float64)
    start = torch.tensor([-3.0, 9.0], dtype=torch.float64)
    errors = []
    for steps in (1, 2, 4, 8, 60):
        lam, count = solve_srelu_threshold(losses, k, delta, start, steps)
        z = losses - lam[:, None]
        reference = (0.5 * (1 + z / torch.sqrt(z * z + delta[:, None] ** 2))).sum(1)  # the slow formula
        assert torch.allclose(count, reference, rtol=1e-9)
        errors.append((count - k).abs())
    for fewer, more in zip(errors, errors[1:]):
        assert bool((more <= fewer + 1e-12).all())
    assert float(errors[-1].max()) < 1e-8


def test_solve_gradient_is_the_smoothed_indicator_and_differs_from_average():
    generator = torch.Generator().manual_seed(4)
    losses = (FLOOR + torch.empty(4096, dtype=torch.float64).exponential_(1.0, generator=generator)).requires_grad_()
    loss = STk(k=0.96, solve_steps=30).double()
    loss(losses).backward()
    lam = loss.lam_last
    z = losses.detach() - lam
    expected = 0.5 * (1 + z / torch.sqrt(z * z + 0.01**2)) / 4096
    assert torch.allclose(losses.grad, expected, rtol=1e-9, atol=1e-15)
    average_grad = torch.full_like(expected, 1 / 4096)
    assert float((losses.grad - 0.96 * average_grad).abs().max()) > 0.1 / 4096  # far more than rounding
    below = float((losses.detach() < lam).double().mean())
    assert 0.02 <= below <= 0.08


def test_matk_solve_is_the_kth_largest_and_equals_scaled_atk():
    losses = torch.tensor([0.5, 4.0, 2.0, 3.0, 1.0], requires_grad=True)
    loss = MATk(k=2)
    value = loss(losses)
    assert float(loss.lam_last) == 3.0 and value.item() == pytest.approx(2 / 5 * (4.0 + 3.0) / 2)
    assert float(kth_largest(losses.detach(), 2)) == 3.0


def test_solve_keeps_lambda_out_of_the_optimizer_and_eval_uses_the_running_average():
    loss = STk(k=0.5)
    assert list(loss.parameters()) == [] and loss.parameter_groups() == []
    first = loss(torch.tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True))
    root = float(loss.lam_last)
    assert float(loss.lam) == root  # the running average starts at the first root
    loss(torch.tensor([10.0, 11.0, 12.0, 13.0], requires_grad=True))
    assert float(loss.lam) == pytest.approx(0.9 * root + 0.1 * float(loss.lam_last))
    with torch.no_grad():  # not a training call: nothing moves
        loss(torch.tensor([50.0, 60.0]))
    assert float(loss.lam) == pytest.approx(0.9 * root + 0.1 * float(loss.lam_last))
    assert math.isfinite(first.item())


def test_a_non_finite_batch_leaves_lambda_as_it_was():
    loss = STk(k=0.5)
    loss(torch.tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True))
    before = (float(loss.lam), float(loss.lam_last))
    value = loss(torch.tensor([0.0, float("nan"), 2.0, 3.0], requires_grad=True))
    assert not math.isfinite(value.item()) and (float(loss.lam), float(loss.lam_last)) == before


def test_gradient_update_with_lam_lr_is_its_own_constant_group():
    loss = STk(k=0.5, lam_update="gradient", lam_lr=0.05, lam_init=0.0)
    assert loss.parameter_groups() == [{"params": [loss.lam], "weight_decay": 0.0, "lr": 0.05, "constant_lr": True}]
    assert STk(k=0.5, lam_update="gradient").parameter_groups()[0].keys() == {"params", "weight_decay"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"lam_update": "newton"}, "unknown lam_update"),
        ({"lam_update": "solve", "smoothing": "elu"}, "needs smoothing"),
        ({"lam_update": "solve", "lam_lr": 0.1}, "lam_lr applies to lam_update='gradient'"),
        ({"lam_update": "solve", "lam_constraint": "clamp"}, "lam_constraint='clamp' applies"),
        ({"smoothing": "elu"}, "lam_update='adaptive' needs smoothing in srelu"),
        ({"lam_lr": 0.1}, "lam_lr applies to lam_update='gradient'; with lam_update='adaptive'"),
        ({"lam_update": "track", "lam_lr": 0.1}, "lam_lr applies to lam_update='gradient'; with lam_update='track'"),
        ({"lam_update": "gradient", "lam_lr": -1.0}, "lam_lr=-1.0 must be a positive number"),
        ({"solve_steps": 0}, "solve_steps=0"),
        ({"lam_momentum": 0.0}, "lam_momentum=0.0"),
        ({"lam_init": "first"}, "lam_init='first'"),
    ],
)
def test_bad_update_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        STk(k=0.5, **kwargs)


def test_k_equal_n_has_no_band():
    loss = STk(k=1.0)
    loss(torch.rand(16, requires_grad=True))
    epoch = loss.monitor.pop_epoch()
    assert epoch["lam_in_band"] is None and lambda_tracking([epoch])["flag"] is None


def _epoch(calls, counted, hits, all_hits):
    """An epoch row of :meth:`LambdaMonitor.pop_epoch` with k < n."""
    return {
        "lam_calls": calls,
        "lam_in_band_counted": counted,
        "lam_in_band_hits": hits,
        "lam_in_band_all_hits": all_hits,
        "lam_in_band": hits / counted if counted else None,
        "lam_in_band_all": all_hits / calls,
    }


def test_a_run_stopped_within_its_burn_in_is_judged_on_all_its_steps():
    monitor = LambdaMonitor()
    monitor.burn_in = 1000  # every call within the burn-in
    for _ in range(5):
        monitor.record(torch.tensor(1.0), 8, 16)  # every loss above λ: out of band (the Average objective)
    epoch = monitor.pop_epoch()
    assert epoch["lam_calls"] == 5 and epoch["lam_in_band_counted"] == 0 and epoch["lam_in_band"] is None
    tracking = lambda_tracking([epoch])
    assert tracking["in_band"] == tracking["in_band_all"] == 0.0
    assert tracking["judged_on"] == ALL_STEPS and tracking["flag"] == LOW_BAND_FLAG
    partly = lambda_tracking([_epoch(6, 0, 0, 4), _epoch(4, 0, 0, 2)])  # 6 of 10 calls in band
    assert partly["in_band"] == 0.6 and partly["judged_on"] == ALL_STEPS and partly["flag"] == PARTLY_TRACKED_FLAG
    counted = lambda_tracking([_epoch(10, 0, 0, 2), _epoch(10, 10, 10, 10)])  # a counted call: after the burn-in
    assert counted["in_band"] == 1.0 and counted["judged_on"] == "after burn-in" and counted["flag"] is None


@pytest.mark.parametrize(
    "hits,flag", [(55, PARTLY_TRACKED_FLAG), (30, LOW_BAND_FLAG), (95, None), (90, None), (50, PARTLY_TRACKED_FLAG)]
)
def test_the_flag_has_two_levels(hits, flag):
    tracking = lambda_tracking([_epoch(110, 100, hits, hits)])
    assert tracking["in_band"] == hits / 100 and tracking["flag"] == flag == flag_for(hits / 100)


def test_k_equal_n_is_never_flagged_even_within_the_burn_in():
    monitor = LambdaMonitor()
    monitor.burn_in = 1000
    monitor.record(torch.tensor(1.0), 16, 16)
    tracking = lambda_tracking([monitor.pop_epoch()])
    assert tracking["in_band"] is None and tracking["judged_on"] is None and tracking["flag"] is None
    assert lambda_tracking([]) == dict.fromkeys(tracking)


def test_engine_logs_the_diagnostics_per_epoch_and_flags_a_stranded_lambda(compose_cfg, tmp_path):
    import csv

    from topklab.engine.run import format_summary, train

    base = ("dataset=wisconsin", "engine.epochs=3", "logger=csv")
    tracked = train(compose_cfg("loss=stk", *base), tmp_path / "solve")
    with open(tmp_path / "solve" / "epochs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {"lam_in_band", "smoothed_share", "hard_share", "lam_minus_kth"} <= rows[0].keys()
    assert tracked["lambda_tracking"]["in_band"] >= 0.9 and tracked["lambda_tracking"]["flag"] is None
    stranded = train(
        compose_cfg("loss=stk", "loss.lam_update=gradient", "loss.lam_init=100.0", *base), tmp_path / "grad"
    )
    assert stranded["lambda_tracking"]["in_band"] == 0.0
    assert LOW_BAND_FLAG in format_summary(stranded)
    assert train(compose_cfg("loss=average", *base), tmp_path / "avg")["lambda_tracking"] is None


def _clustered_token_losses(generator) -> torch.Tensor:
    """2,048 token losses as label smoothing shapes them: 1,900 piled within 0.01 above a floor, the
    rest spread above it; the k-th largest (k = 0.96 n) lies just below that pile."""
    pile = 1.18 + 0.004 * torch.randn(1900, generator=generator, dtype=torch.float64).abs()
    spread = 1.3 + 6 * torch.rand(148, generator=generator, dtype=torch.float64)
    return torch.cat([pile, spread])[None]


@pytest.mark.parametrize("below", [0.03, 0.05])
def test_the_solve_recovers_from_a_warm_start_a_few_deltas_below_a_pile_of_losses(below):
    generator = torch.Generator().manual_seed(0)
    k, delta = torch.tensor([0.96 * 2048], dtype=torch.float64), torch.tensor([0.01], dtype=torch.float64)
    losses = _clustered_token_losses(generator)
    root, _ = solve_srelu_threshold(losses, k, delta, torch.ones(1, dtype=torch.float64), steps=60)
    lam = root - below
    for _ in range(5):  # five training calls at the default solve_steps=2
        lam, count = solve_srelu_threshold(_clustered_token_losses(generator), k, delta, lam, steps=2)
    assert in_band(count / 2048, 0.96)


def test_the_power_law_step_lands_on_the_root_of_a_far_pile():
    one = torch.ones(1, dtype=torch.float64)
    pile = torch.zeros(1, 1000, dtype=torch.float64)
    for k, lam in ((900.0, -1000.0), (100.0, 1000.0)):  # 1000δ below / above a pile of equal losses
        start = lam * one
        slope, curvature = srelu_slope_and_curvature(pile - start[:, None], one[:, None])
        count, bend = slope.sum(1), curvature.sum(1)
        change = curvature_change(pile - start[:, None], one[:, None], curvature).sum(1)
        landed = start + power_law_step(count, count - k, k * one, 1000, bend, change)
        root, _ = solve_srelu_threshold(pile, k * one, one, start, steps=80)
        newton = start + (count - k) / bend
        assert abs(float(landed - root)) < 0.01 * abs(lam) < abs(float(newton - root))


def test_among_spread_losses_the_step_is_newtons(monkeypatch):
    """Evenly spread losses: the step is Newton's. Uniform losses that fall by 100 δ per call from a
    warm start: taking Newton's step where the q read is above ½ (NEWTON_ABOVE) keeps λ in band on
    at least 0.9 of the calls; without that rule the power law read near the losses' edge stops
    short of the root and fewer calls are in band."""
    one = torch.ones(1, dtype=torch.float64)
    spread = torch.linspace(0.0, 10.0, 1001, dtype=torch.float64)[None]
    start, k, delta = 5.0 * one, 300.0 * one, 0.01 * one
    slope, curvature = srelu_slope_and_curvature(spread - start[:, None], delta[:, None])
    count, bend = slope.sum(1), curvature.sum(1)
    change = curvature_change(spread - start[:, None], delta[:, None], curvature).sum(1)
    step = power_law_step(count, count - k, k, 1001, bend, change)
    torch.testing.assert_close(step, (count - k) / bend, rtol=1e-12, atol=0)

    def in_band_share() -> float:
        hits = []
        for seed in range(20):
            generator, lam = torch.Generator().manual_seed(seed), torch.zeros(1, dtype=torch.float64)
            for call in range(8):
                losses = torch.rand(1, 3000, generator=generator, dtype=torch.float64) * 4 + 3 - call
                lam, count = solve_srelu_threshold(losses, 900 * one, 0.01 * one, lam, steps=2)
                hits.append(bool(in_band(count / 3000, 0.3)))
        return sum(hits) / len(hits)

    with_rule = in_band_share()
    monkeypatch.setattr(solve, "NEWTON_ABOVE", 1.0)  # q <= 1 always: the power law's step everywhere
    assert with_rule >= 0.9 > in_band_share()


SHAPES = {  # loss rows of the shapes a batch takes, 2,048 losses each
    "normal": lambda g: torch.randn(2048, generator=g, dtype=torch.float64),
    "exponential": lambda g: torch.empty(2048, dtype=torch.float64).exponential_(generator=g),
    "lognormal": lambda g: (2 * torch.randn(2048, generator=g, dtype=torch.float64)).exp(),
    "five_ties": lambda g: torch.randint(0, 5, (2048,), generator=g).double(),
    "two_modes": lambda g: torch.cat(
        [0.01 * torch.randn(1024, generator=g), 5 + 0.01 * torch.randn(1024, generator=g)]
    ),
    "label_smoothing_pile": lambda g: _clustered_token_losses(g)[0],
}


@pytest.mark.parametrize("path", ["eager", "native"])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.96])
@pytest.mark.parametrize("delta", [0.01, 1.0])
def test_from_any_warm_start_two_steps_per_call_are_in_band_after_five_calls(path, fraction, delta):
    """Warm starts 1 to 100 δ on either side of the root, losses redrawn every call, the default
    solve_steps=2. With Newton's step in place of the power-law step, three of the six eager
    parametrizations fail (λ stuck beside tight modes, a pile, or a heavy tail at k/n = 0.96)."""
    stuck = []
    k, width = torch.tensor([fraction * 2048], dtype=torch.float64), torch.tensor([delta], dtype=torch.float64)
    for name, shape in SHAPES.items():
        generator = torch.Generator().manual_seed(1)
        batches = [shape(generator).double()[None] for _ in range(6)]
        root, _ = solve_srelu_threshold(batches[0], k, width, torch.zeros(1, dtype=torch.float64), steps=80)
        for offset in (-100, -10, -5, -3, -1, 1, 3, 5, 10, 100):
            lam = root + offset * delta
            for batch in batches[1:]:
                lam, count = solve_srelu_threshold(batch, k, width, lam, steps=2, path=path, required=path == "native")
            if not bool(in_band(count / 2048, fraction)):
                stuck.append((name, offset, round(float(count) / 2048, 3)))
    assert stuck == []
