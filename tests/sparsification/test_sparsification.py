"""Top-k gradient sparsification: each selector against a slow obvious reference, error feedback's
conservation law, the dense exchange equal to the whole-batch gradient, and the engine's resume."""

import warnings
from functools import partial

import pytest
import torch
from torch import nn

from topklab.sparsification import ExactTopK, SampledThreshold, SparseGradientExchange, STkThresholdSelector


def heavy_tailed(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=generator) * torch.rand(n, generator=generator) ** 3).abs()


def test_exact_topk_is_the_k_largest_by_a_full_sort():
    values = heavy_tailed(5000)
    chosen = ExactTopK()(values, 50)
    assert set(chosen.tolist()) == set(torch.sort(values, descending=True).indices[:50].tolist())


@pytest.mark.parametrize("k", [5, 100, 1000])
def test_stk_threshold_sends_k_up_to_its_tolerance_and_only_entries_above_lambda(k):
    values = heavy_tailed(20_000)
    selector = STkThresholdSelector(delta=0.01, count_tolerance=0.05)
    chosen = selector(values, k)
    lam = float(selector.lam)
    assert chosen.tolist() == [i for i, v in enumerate(values.tolist()) if v > lam]  # slow obvious reference
    assert abs(len(chosen) - k) <= 0.1 * k + 2  # 5 % on the smoothed count, a little more on the hard one


@pytest.mark.parametrize("kernel", ["eager", "native"])
@pytest.mark.parametrize("k", [100, 300])
def test_stk_threshold_sends_k_of_a_tie_at_the_largest_magnitude(kernel, k):
    """Clipped gradients: 1,276 of 100,000 magnitudes tie at the clip value 2.5, more than 2k. The smoothed
    count's root lies at 2.5 to float32's precision and no magnitude exceeds it: the selector sent
    nothing (a second read found it); it sends k of the tie, the lowest indices first."""
    magnitudes = torch.randn(100_000, generator=torch.Generator().manual_seed(0)).clamp(-2.5, 2.5).abs()
    tied = (magnitudes == 2.5).nonzero().view(-1)
    assert len(tied) > 2 * k
    sent = STkThresholdSelector(kernel=kernel)(magnitudes, k)
    assert torch.equal(sent, tied[:k])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stk_threshold_native_sums_take_the_eager_steps(dtype):
    values = heavy_tailed(20_000).to(dtype)
    eager, native = STkThresholdSelector(), STkThresholdSelector(kernel="native")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a C++ build that fails would fall back to eager with a warning
        assert torch.equal(eager(values, 200), native(values, 200))
    assert native.iterations == eager.iterations and float(native.lam) == pytest.approx(float(eager.lam), rel=1e-6)


def test_stk_threshold_warm_start_needs_fewer_steps_on_a_slightly_changed_vector():
    values = heavy_tailed(50_000)
    warm, cold = STkThresholdSelector(warm_start=True), STkThresholdSelector(warm_start=False)
    warm(values, 500), cold(values, 500)
    moved = values * (1 + 0.01 * torch.randn(values.shape, generator=torch.Generator().manual_seed(1)))
    warm(moved, 500), cold(moved, 500)
    assert warm.iterations < cold.iterations


def test_sampled_threshold_sends_at_most_k_of_the_largest_and_is_seeded():
    values = heavy_tailed(100_000)
    chosen = SampledThreshold(seed=3)(values, 1000)
    assert 0.8 * 1000 <= len(chosen) <= 1000
    assert float(values[chosen].min()) >= float(torch.sort(values, descending=True).values[int(1.3 * 1000)])
    assert torch.equal(SampledThreshold(seed=3)(values, 1000).sort().values, chosen.sort().values)


@pytest.mark.parametrize("selector", [ExactTopK, partial(SampledThreshold, seed=0), STkThresholdSelector])
def test_selectors_reject_a_k_out_of_range(selector):
    with pytest.raises(ValueError, match="must be an int in"):
        selector()(torch.rand(10), 11)


@pytest.mark.parametrize(
    "selector", [partial(ExactTopK), partial(SampledThreshold, sample_ratio=0.2), partial(STkThresholdSelector)]
)
def test_error_feedback_conserves_the_sum_of_the_gradients(selector):
    torch.manual_seed(0)
    weight = nn.Parameter(torch.zeros(3000))
    exchange = SparseGradientExchange(workers=3, keep_ratio=0.01, selector=selector)
    exchange.attach([weight])
    computed, sent = torch.zeros(3000, dtype=torch.float64), torch.zeros(3000, dtype=torch.float64)
    for _ in range(20):
        for worker in range(3):
            weight.grad = torch.randn(3000)
            computed += weight.grad.double()
            exchange.collect(worker)
        exchange.apply()
        sent += weight.grad.double()
        assert (weight.grad != 0).sum() <= 3 * 1.3 * exchange.k  # sparse: at most workers × k entries
    torch.testing.assert_close(sent + exchange.residual.double().sum(0), computed, atol=1e-4, rtol=0)


def test_the_dense_exchange_steps_with_the_whole_batch_gradient():
    torch.manual_seed(0)
    model, x, y = nn.Linear(5, 2), torch.randn(12, 5), torch.randn(12, 2)
    (model(x) - y).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    exchange = SparseGradientExchange(workers=4, keep_ratio=1.0)
    exchange.attach(model.parameters())
    for worker, part in enumerate(exchange.shards(12)):
        (((model(x[part]) - y[part]).square().mean()) * (part.stop - part.start) / 12).backward()
        exchange.collect(worker)
    exchange.apply()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)


def test_bad_settings_get_one_line_errors():
    with pytest.raises(ValueError, match="unknown kernel 'fast'; choose one of: eager, native"):
        STkThresholdSelector(kernel="fast")
    with pytest.raises(ValueError, match="keep_ratio"):
        SparseGradientExchange(workers=2, keep_ratio=0.0, selector=ExactTopK)
    with pytest.raises(ValueError, match="selector is needed"):
        SparseGradientExchange(workers=2, keep_ratio=0.1)
    with pytest.raises(ValueError, match="cannot feed"):
        SparseGradientExchange(workers=4, keep_ratio=1.0).shards(3)


def test_fp16_loss_scale_is_divided_out_and_an_overflow_leaves_the_residuals():
    from functools import partial

    from topklab.sparsification import ExactTopK, SparseGradientExchange

    def step(exchange, weight, gradients, scale):
        for worker, gradient in enumerate(gradients):
            weight.grad = torch.tensor(gradient) * scale
            exchange.collect(worker, scale=scale)
        exchange.apply(scale=scale)
        return weight.grad / scale

    plain, scaled = (SparseGradientExchange(workers=2, keep_ratio=0.5, selector=partial(ExactTopK)) for _ in range(2))
    weights = [torch.nn.Parameter(torch.zeros(4)) for _ in range(2)]
    plain.attach([weights[0]])
    scaled.attach([weights[1]])
    gradients = [[4.0, 0.0, 1.0, 0.5], [0.0, 2.0, 0.0, 3.0]]
    assert torch.equal(step(plain, weights[0], gradients, 1.0), step(scaled, weights[1], gradients, 1024.0))
    assert torch.equal(plain.residual, scaled.residual)
    before = scaled.residual.clone()
    skipped = step(scaled, weights[1], [[float("inf"), 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], 1024.0)
    assert not bool(torch.isfinite(skipped).any()) and torch.equal(scaled.residual, before)


def test_the_bracketed_sampled_threshold_never_sends_fewer_than_k_and_dgc_s_rule_can():
    from topklab.sparsification.selectors import SampledThreshold

    generator = torch.Generator().manual_seed(0)
    counts = {"bracketed": [], "dgc": []}
    for _ in range(40):
        magnitudes = torch.randn(200_000, generator=generator).abs() ** 3
        for mode in counts:
            counts[mode].append(len(SampledThreshold(seed=1, adaptation=mode)(magnitudes, 200)))
    assert counts["bracketed"] == [200] * 40
    assert min(counts["dgc"]) < 0.9 * 200
