import math

import pytest
import torch

from topklab.losses import ATk, Average, MATk, Maximum, STk
from topklab.losses.aggregate.base import Aggregate
from topklab.losses.aggregate.solve import kth_largest_value
from topklab.smoothing import SMOOTHINGS, srelu
from topklab.utils.k import resolve_k, validate_k


def distinct_losses(n, seed=0, dtype=torch.float64):
    """Non-negative, well-separated per-sample losses (no ties, so subgradients are unique)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(n, generator=g).to(dtype) + torch.rand(n, generator=g, dtype=dtype) * 0.5) / n * 3


def slow_atk(losses, k):
    values = sorted(losses.tolist(), reverse=True)
    return sum(values[:k]) / k


def slow_matk(losses, k, lam):
    n = len(losses)
    return sum(max(v - lam, 0.0) for v in losses.tolist()) / n + k / n * lam


# ---------- ATk / Average / Maximum ----------


@pytest.mark.parametrize("method", ["topk", "sort"])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 1), (7, 3), (50, 17), (50, 50), (64, 0.25), (33, 1.0)])
def test_atk_matches_sorted_reference(method, n, k):
    losses = distinct_losses(n, seed=n)
    got = ATk(k, method=method)(losses)
    assert got.item() == pytest.approx(slow_atk(losses, resolve_k(k, n)), rel=1e-12)


def test_atk_with_ties_matches_reference():
    losses = torch.tensor([2.0, 5.0, 5.0, 5.0, 1.0], dtype=torch.float64)
    assert ATk(2)(losses).item() == pytest.approx(5.0)
    assert ATk(4)(losses).item() == pytest.approx(17.0 / 4)


def test_k_equal_n_is_average_and_k_one_is_maximum():
    losses = distinct_losses(40, seed=3)
    assert ATk(40)(losses).item() == pytest.approx(Average()(losses).item(), rel=1e-12)
    assert ATk(1.0)(losses).item() == pytest.approx(Average()(losses).item(), rel=1e-12)
    assert ATk(1)(losses).item() == pytest.approx(Maximum()(losses).item(), rel=1e-12)
    # the same holds for the minimum over λ of MATk/STk (ATk scaling)
    for k, expected in ((40, Average()(losses)), (1, Maximum()(losses))):
        matk = MATk(k, scale="atk").double()
        assert min_over_lambda(matk, losses) == pytest.approx(expected.item(), rel=1e-10)


@pytest.mark.parametrize("make", [lambda: ATk(5), lambda: ATk(0.3, method="sort"), Average, Maximum])
def test_gradcheck_sort_based(make):
    losses = distinct_losses(23, seed=5).requires_grad_()
    assert torch.autograd.gradcheck(make().double(), (losses,))


# ---------- MATk ----------


def min_over_lambda(loss, losses):
    """Exact minimum of the piecewise-linear convex MATk over λ: attained at a breakpoint ℓ_i."""
    best = math.inf
    for candidate in losses.tolist():
        with torch.no_grad():
            loss.lam.fill_(candidate)
            best = min(best, loss(losses).item())
    return best


@pytest.mark.parametrize("n,k", [(10, 1), (10, 3), (31, 0.5), (64, 0.9), (64, 64)])
def test_matk_minimum_over_lambda_is_k_over_n_atk(n, k):
    losses = distinct_losses(n, seed=k if isinstance(k, int) else 7)
    kk = resolve_k(k, n)
    matk = MATk(k).double()
    assert min_over_lambda(matk, losses) == pytest.approx(kk / n * slow_atk(losses, kk), rel=1e-12)
    # and λ = ℓ_[k] is a minimiser
    with torch.no_grad():
        matk.lam.fill_(sorted(losses.tolist(), reverse=True)[kk - 1])
    assert matk(losses).item() == pytest.approx(kk / n * slow_atk(losses, kk), rel=1e-12)


def test_matk_matches_equation_5_at_any_lambda():
    losses = distinct_losses(20, seed=1)
    for lam in (-1.0, 0.0, 0.75, 1.875, 10.0):  # exact in float32 (λ is created float32)
        matk = MATk(6, lam_update="gradient", lam_init=lam).double()
        assert matk(losses).item() == pytest.approx(slow_matk(losses, 6, lam), rel=1e-12)


def test_atk_scale_is_n_over_k_times_paper_scale():
    losses = distinct_losses(30, seed=2)
    for cls in (MATk, STk):
        paper, atk = (
            cls(9, lam_update="gradient", lam_init=0.75).double(),
            cls(9, lam_update="gradient", lam_init=0.75, scale="atk").double(),
        )
        assert atk(losses).item() == pytest.approx(paper(losses).item() * 30 / 9, rel=1e-12)


def test_gradcheck_matk_in_losses_and_lambda():
    losses = distinct_losses(17, seed=4)
    lam = torch.tensor(1.234567, dtype=torch.float64, requires_grad=True)  # not at a breakpoint

    def module_value(losses, lam):
        return _module_value(MATk(4, lam_update="gradient", lam_init=0.0).double(), losses, lam)

    assert torch.autograd.gradcheck(module_value, (losses.requires_grad_(), lam))


def _module_value(module, losses, lam):
    """Evaluate ``module`` with its λ replaced by the tensor ``lam`` (so gradcheck can vary it)."""
    return torch.func.functional_call(module, {"lam": lam}, (losses,))


# ---------- STk ----------


@pytest.mark.parametrize("smoothing", sorted(set(SMOOTHINGS) - {"relu"}))
def test_gradcheck_stk(smoothing):
    losses = distinct_losses(19, seed=6).requires_grad_()
    lam = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    stk = STk(0.4, delta=0.05, smoothing=smoothing, lam_update="gradient", lam_init=0.0).double()
    assert torch.autograd.gradcheck(lambda values, t: _module_value(stk, values, t), (losses, lam))


def test_stk_matches_equation_6():
    losses = distinct_losses(25, seed=8)
    delta, k, lam = 0.01, 5, 1.125
    expected = (
        sum((v - lam) + delta * (math.sqrt((v - lam) ** 2 / delta**2 + 1) - 1) for v in losses.tolist()) / (2 * 25)
        + k / 25 * lam
    )
    assert STk(k, delta=delta, lam_update="gradient", lam_init=lam).double()(losses).item() == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("delta", [0.1, 0.01, 1e-3, 1e-4])
def test_stk_within_delta_over_two_below_matk(delta):
    losses = distinct_losses(50, seed=9)
    for lam in torch.linspace(-1, 4, 41).tolist():
        stk = STk(10, delta=delta, lam_update="gradient", lam_init=lam).double()(losses).item()
        matk = MATk(10, lam_update="gradient", lam_init=lam).double()(losses).item()
        assert matk - delta / 2 <= stk <= matk + 1e-15


def test_stk_tends_to_matk_as_delta_shrinks():
    losses = distinct_losses(50, seed=10)
    gaps = [
        abs(
            STk(10, delta=d, lam_update="gradient", lam_init=1.0).double()(losses).item()
            - MATk(10, lam_update="gradient", lam_init=1.0).double()(losses).item()
        )
        for d in (1e-1, 1e-2, 1e-3, 1e-4, 1e-6)
    ]
    assert all(a > b for a, b in zip(gaps, gaps[1:]))
    assert gaps[-1] < 1e-6


def test_srelu_values_and_bound():
    assert srelu(torch.tensor(0.0), 0.01).item() == 0.0
    assert srelu(torch.tensor(1.0, dtype=torch.float64), 0.01).item() == pytest.approx(0.995025, abs=1e-6)
    assert srelu(torch.tensor(-1.0, dtype=torch.float64), 0.01).item() == pytest.approx(-0.004975, abs=1e-6)
    x = torch.linspace(-50, 50, 10001, dtype=torch.float64)
    for delta in (0.1, 0.05, 0.01):
        gap = torch.relu(x) - srelu(x, delta)
        assert gap.min() >= 0 and gap.max() < delta / 2
    assert torch.autograd.gradcheck(lambda t: srelu(t, 0.1), (torch.randn(30, dtype=torch.float64).requires_grad_(),))


# ---------- λ ----------


@pytest.mark.parametrize("cls,kwargs", [(MATk, {}), (STk, {"delta": 1e-3})])
def test_sgd_on_lambda_approaches_kth_largest(cls, kwargs):
    losses = distinct_losses(200, seed=11, dtype=torch.float32)
    k = 20
    kth, next_ = sorted(losses.tolist(), reverse=True)[k - 1 : k + 1]
    loss = cls(k, lam_update="gradient", lam_init=0.0, **kwargs)
    opt = torch.optim.SGD(loss.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / math.sqrt(t + 1))
    for _ in range(3000):
        opt.zero_grad()
        loss(losses).backward()
        opt.step()
        sched.step()
    spacing = kth - next_
    assert abs(loss.threshold.item() - kth) < max(spacing, 2e-3), (loss.threshold.item(), kth, next_)


def test_lambda_constraints():
    losses = -distinct_losses(10, seed=12, dtype=torch.float32)  # all negative: unconstrained λ* < 0
    for constraint, init in (("clamp", 0.5), ("softplus", 0.5)):
        loss = MATk(3, lam_update="gradient", lam_init=init, lam_constraint=constraint)
        assert loss.threshold.item() == pytest.approx(init, rel=1e-6)
        opt = torch.optim.SGD(loss.parameters(), lr=0.5)
        for _ in range(100):
            opt.zero_grad()
            loss(losses).backward()
            opt.step()
        assert loss.threshold.item() >= 0.0
    free = MATk(3, lam_update="gradient", lam_init=0.5)
    opt = torch.optim.SGD(free.parameters(), lr=0.5)
    for _ in range(100):
        opt.zero_grad()
        free(losses).backward()
        opt.step()
    assert free.threshold.item() < 0.0


def test_lambda_is_a_parameter_named_lam():
    stk = STk(0.9, lam_update="gradient", lam_init=0.0)
    assert [name for name, _ in stk.named_parameters()] == ["lam"]


# ---------- validation ----------


@pytest.mark.parametrize("k", [0, -3, 0.0, 1.5, float("nan"), -0.1])
def test_bad_k_values(k):
    with pytest.raises(ValueError, match="k="):
        validate_k(k)


@pytest.mark.parametrize("k", ["5", None, True, [1]])
def test_bad_k_types(k):
    with pytest.raises(TypeError, match="k must be an int"):
        validate_k(k)


def test_k_larger_than_batch_is_an_error():
    with pytest.raises(ValueError, match="exceeds the number of losses n=4"):
        ATk(5)(torch.ones(4))
    with pytest.raises(ValueError, match="exceeds"):
        STk(5)(torch.ones(4))


@pytest.mark.parametrize("delta", [0, -0.01, "0.1"])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        STk(3, delta=delta)


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="choose one of: elu, leaky_relu, relu, softplus, srelu"):
        STk(3, smoothing="gelu")
    with pytest.raises(ValueError, match="choose one of: clamp, none, softplus"):
        STk(3, lam_constraint="abs")
    with pytest.raises(ValueError, match="choose one of: topk, sort"):
        ATk(3, method="heap")
    with pytest.raises(ValueError, match="lam_init"):
        STk(3, lam_constraint="softplus", lam_update="gradient", lam_init=0.0)


def test_aggregate_rejects_non_vector_input():
    with pytest.raises(ValueError, match="1-D tensor"):
        Average()(torch.ones(()))  # a (3, 2) input is three rows now (tests/losses/test_aggregate_shapes.py)
    with pytest.raises(ValueError, match="empty"):
        STk(0.5)(torch.ones(0))


def test_fraction_rounding():
    assert resolve_k(0.9, 16) == 14
    assert resolve_k(0.3, 10) == 3
    assert resolve_k(0.05, 10) == 1
    assert resolve_k(1.0, 7) == 7


@pytest.mark.parametrize(
    "p_k,error,match",
    [
        ([0.5, 0.4], ValueError, "sums to 0.9"),
        ([1.2, -0.2], ValueError, "P_K\\[1\\]=-0.2 must be"),
        (["a", 1], TypeError, "P_K\\[0\\]='a' is not a number"),
        ("0.5,0.5", TypeError, "non-empty list"),
        ([], TypeError, "non-empty list"),
        ([0.2] * 5, None, None),
    ],
)
def test_p_k_validation(p_k, error, match):
    from topklab.losses.pk import validate_p_k

    if error is None:
        assert validate_p_k(p_k, num_classes=5) == [0.2] * 5
        with pytest.raises(ValueError, match="length 5 > 3 classes"):
            validate_p_k(p_k, num_classes=3)
    else:
        with pytest.raises(error, match=match):
            validate_p_k(p_k)


# ---------- one kernel per aggregate: batched rows vs the 1-D module ----------


def _module(name, k, delta, **settings):
    return {
        "average": lambda: Average(),
        "maximum": lambda: Maximum(),
        "atk": lambda: ATk(k, **settings),
        "matk": lambda: MATk(k, lam_update="gradient", lam_init=0.0, **settings),
        "stk": lambda: STk(k, delta=delta, lam_update="gradient", lam_init=0.0, **settings),
    }[name]()


@pytest.mark.parametrize(
    "name,settings",
    [
        ("average", {}),
        ("maximum", {}),
        ("atk", {}),
        ("atk", {"method": "sort"}),
        ("matk", {}),
        ("matk", {"scale": "atk"}),
        ("stk", {}),
        ("stk", {"smoothing": "elu"}),
        ("stk", {"scale": "atk"}),
    ],
)
def test_batched_kernel_matches_the_module_row_by_row(name, settings):
    g = torch.Generator().manual_seed(7)
    losses = (torch.rand(5, 12, dtype=torch.float64, generator=g) * 3).requires_grad_()
    k = torch.tensor([1, 3, 6, 12, 7], dtype=torch.float64)
    lam = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.5], dtype=torch.float64)
    delta = torch.tensor([0.1, 0.01, 0.05, 0.2, 0.001], dtype=torch.float64)
    kernel = _module(name, 1, 0.01, **settings).double()
    batched = kernel.batched(losses, k, lam, delta)
    (grad_batched,) = torch.autograd.grad(batched.sum(), losses)
    for row in range(5):
        module = _module(name, int(k[row]), float(delta[row]), **settings).double()
        if module.has_threshold:
            with torch.no_grad():
                module.lam.fill_(lam[row])
        value = module(losses[row])
        assert batched[row].item() == pytest.approx(value.item(), rel=1e-12)
        (grad_row,) = torch.autograd.grad(value, losses)
        torch.testing.assert_close(grad_batched[row], grad_row[row], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "name,axes,threshold",
    [
        ("average", (), False),
        ("maximum", (), False),
        ("atk", ("k",), False),
        ("matk", ("k",), True),
        ("stk", ("k", "delta"), True),
    ],
)
def test_registry_resolves_loss_configs(name, axes, threshold):
    from topklab.engine.aggregates import aggregate_class, build_aggregate

    cls = aggregate_class(name)
    assert cls.hyperparameters == axes and cls.has_threshold is threshold
    assert type(build_aggregate(name)) is cls


def test_registry_errors_list_the_choices():
    from topklab.engine.aggregates import aggregate_class, build_aggregate
    from topklab.utils.errors import TopklabError

    with pytest.raises(TopklabError, match="unknown aggregate 'atk2'; choose one of: atk, average, matk, maximum, stk"):
        aggregate_class("atk2")
    with pytest.raises(TopklabError, match="aggregate 'average' has no field\\(s\\) scale; its fields: none"):
        build_aggregate("average", scale="atk")


@pytest.mark.parametrize("method", ["topk", "sort"])
def test_atk_ignores_a_minus_infinite_loss_beyond_k(method):
    losses = torch.tensor([-math.inf, 1.0, 5.0, 3.0], dtype=torch.float64, requires_grad=True)
    value = ATk(k=2, method=method)(losses)
    value.backward()
    assert value.item() == 4.0 and torch.equal(losses.grad, torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64))


def test_kth_largest_by_topk_is_kthvalue_with_ties_infinities_and_nan():
    """CUDA's path (topk of the shorter side) picks the value kthvalue picks, NaN counting as the largest."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for _ in range(300):
            n = int(torch.randint(1, 30, (1,), generator=generator))
            x = torch.randint(-3, 4, (n,), generator=generator).to(dtype)
            draw = torch.rand(n, generator=generator)
            x[draw < 0.1], x[(draw >= 0.1) & (draw < 0.2)], x[(draw >= 0.2) & (draw < 0.25)] = (
                float("inf"),
                float("-inf"),
                float("nan"),
            )
            for k in range(1, n + 1):
                expected, got = x.kthvalue(n + 1 - k).values, kth_largest_value(x, k, by_topk=True)
                assert got.dtype == dtype and (torch.equal(got, expected) or (got.isnan() and expected.isnan())), (x, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_average_fast_path_is_the_batched_path_bit_for_bit(dtype):
    """Average() on a CPU returns x.mean() directly where it is finite; that is the batched path's value and gradient."""
    generator = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 16, 33, 1000, 4097):
        losses = (torch.rand(n, generator=generator) * 10).to(dtype)
        fast, batched = losses.clone().requires_grad_(True), losses.clone().requires_grad_(True)
        value_fast, value_batched = Average()(fast), Aggregate.forward(Average(), batched)
        value_fast.backward()
        value_batched.backward()
        assert torch.equal(value_fast, value_batched) and torch.equal(fast.grad, batched.grad), n
    huge = torch.full((4,), torch.finfo(dtype).max, dtype=dtype)  # the sum overflows: the batched path's float64 mean
    assert torch.isfinite(Average()(huge)) and Average()(huge) == torch.finfo(dtype).max


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("make", [Maximum, lambda: ATk(k=0.3), lambda: ATk(k=1), lambda: ATk(k=0.3, method="sort")])
def test_maximum_and_atk_fast_paths_are_the_batched_path_bit_for_bit(dtype, make):
    """With ties and infinities; an infinite ATk value takes the batched path itself."""
    generator = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 16, 33, 1000, 4097):
        losses = torch.randint(0, 5, (n,), generator=generator).to(dtype)
        draw = torch.rand(n, generator=generator)
        losses[draw < 0.05], losses[(draw > 0.05) & (draw < 0.08)] = float("-inf"), float("inf")
        fast, batched = losses.clone().requires_grad_(True), losses.clone().requires_grad_(True)
        value_fast, value_batched = make()(fast), Aggregate.forward(make(), batched)
        value_fast.backward()
        value_batched.backward()
        assert torch.equal(value_fast, value_batched) or (value_fast.isnan() and value_batched.isnan()), n
        assert torch.equal(fast.grad.nan_to_num(), batched.grad.nan_to_num()), n


def test_atk_in_bfloat16_averages_exactly_k_losses():
    """k = 257 is not a bfloat16 number (the batched path's k tensor rounds it to 256); ATk() uses the int."""
    losses = torch.cat([torch.zeros(256), torch.full((744,), -256.0)]).double()  # the 257th largest is -256
    expected = losses.topk(257).values.mean()  # -256/257, where the top 256 alone average 0
    assert ATk(k=257)(losses.to(torch.bfloat16)).double() == expected.to(torch.bfloat16).double() != 0


def test_atk_batched_in_bfloat16_averages_exactly_k_losses():
    """The batched path and 2-D input too: bfloat16 rows are summed in float32 with k = 257 exact."""
    losses = torch.cat([torch.zeros(256), torch.full((744,), -256.0)])
    expected = losses.topk(257).values.mean().to(torch.bfloat16).expand(2)  # -256/257 rounded once
    rows = torch.stack([losses, losses.flip(0)]).to(torch.bfloat16)
    assert torch.equal(ATk(k=257).batched(rows, torch.tensor([257.0, 257.0]), None, None), expected)
    assert torch.equal(ATk(k=257)(rows), expected)
