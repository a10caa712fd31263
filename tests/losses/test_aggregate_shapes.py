"""Aggregates on losses of any shape: ``(..., n)`` reduced over ``dim``, batched over
the other axes, against a per-row float64 reference built from the 1-D call in a Python loop; k as an
int, a fraction or a tensor (one per row); float64 gradcheck on a small batched input; float16 and
bfloat16 aggregated in float32 (k included) and returned in their dtype; bad input one line each."""

import itertools

import pytest
import torch

from topklab.losses import AggregateInputError, ATk, Average, MATk, Maximum, SoftATk, STk
from topklab.losses.aggregate.solve import kth_largest, kth_largest_value
from topklab.operators import LapSum
from topklab.utils.errors import TopklabError

SHAPE = (3, 4, 5)  # n = SHAPE[dim]: 5, 3 or 4 losses per row, 12 to 20 rows
HALF = [torch.float16, torch.bfloat16]
INF, NAN = float("inf"), float("nan")

AGGREGATES = {
    "average": lambda k, **kw: Average(**kw),
    "maximum": lambda k, **kw: Maximum(**kw),
    "atk_topk": lambda k, **kw: ATk(k, **kw),
    "atk_sort": lambda k, **kw: ATk(k, method="sort", **kw),
    "matk_solve": lambda k, **kw: MATk(k, **kw),
    "matk_gradient_atk_scale": lambda k, **kw: MATk(k, lam_update="gradient", lam_init=0.7, scale="atk", **kw),
    "stk_solve": lambda k, **kw: STk(k, delta=0.05, lam_update="solve", solve_steps=30, **kw),
    "stk_gradient_native": lambda k, **kw: STk(k, lam_update="gradient", lam_init=0.7, kernel="native", **kw),
    "stk_elu": lambda k, **kw: STk(k, smoothing="elu", lam_update="gradient", lam_init=0.7, **kw),
    "soft_atk": lambda k, **kw: SoftATk(k, operator=LapSum(alpha=0.5), **kw),
}
WITH_K = [name for name in AGGREGATES if name not in ("average", "maximum")]


def distinct(shape, seed=0, dtype=torch.float64):
    """Losses in [0, 3), far enough apart that no two tie (unique subgradients)."""
    g = torch.Generator().manual_seed(seed)
    count = torch.Size(shape).numel()
    values = (torch.randperm(count, generator=g).to(dtype) + 0.5 * torch.rand(count, generator=g, dtype=dtype)) / count
    return (3 * values).reshape(shape)


def per_row_reference(name, k, losses, dim):
    """Value and gradient of every row by the 1-D call in float64, one fresh module per row."""
    moved = losses.detach().double().movedim(dim, -1)
    batch = moved.shape[:-1]
    ks = torch.broadcast_to(k, batch) if isinstance(k, torch.Tensor) else None
    values, grads = torch.empty(batch, dtype=torch.float64), torch.empty_like(moved)
    for index in itertools.product(*map(range, batch)):
        row = moved[index].clone().requires_grad_()
        row_k = k if ks is None else ks[index].item()
        value = AGGREGATES[name](row_k).double()(row)
        values[index] = value.detach()
        (grads[index],) = torch.autograd.grad(value, row)
    return values, grads.movedim(-1, dim)


def value_and_grad(module, losses):
    losses = losses.clone().requires_grad_()
    value = module(losses)
    (grad,) = torch.autograd.grad(value.sum(), losses)
    return value, grad


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("k", [2, 0.5])
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_every_aggregate_reduces_dim_as_the_1d_call_on_each_row(name, k, dim):
    losses = distinct(SHAPE, seed=abs(dim))
    value, grad = value_and_grad(AGGREGATES[name](k, dim=dim).double(), losses)
    want, want_grad = per_row_reference(name, k, losses, dim)
    expected_shape = SHAPE[: dim % 3] + SHAPE[dim % 3 + 1 :]
    assert value.shape == expected_shape and value.dtype == torch.float64
    # the solve of STk reaches each row's root from another start than the row alone: 1e-9
    tolerance = 1e-9 if name == "stk_solve" else 1e-12
    torch.testing.assert_close(value, want, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(grad, want_grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", WITH_K)
def test_a_tensor_k_gives_each_row_its_own_k(name):
    losses = distinct((2, 3, 6), seed=4)
    counts = torch.tensor([[1, 4, 6], [2, 2, 5]])
    for k in (counts, counts[1], torch.tensor([[0.2, 0.5, 1.0], [0.9, 0.4, 0.1]])):
        value, grad = value_and_grad(AGGREGATES[name](k).double(), losses)
        want, want_grad = per_row_reference(name, k, losses, -1)
        tolerance = 1e-9 if name == "stk_solve" else 1e-12
        torch.testing.assert_close(value, want, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(grad, want_grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", [*(name for name in AGGREGATES if name != "matk_solve"), "atk_tensor_k"])
def test_gradcheck_float64_on_a_batched_input(name):
    """STk's λ solved to its root or held fixed, so the gradient is the total derivative (MATk's solved
    λ = ℓ_[k] sits on ReLU's kink, where its gradient is a subgradient: the per-row reference checks it)."""
    losses = distinct((2, 4, 3), seed=5).requires_grad_()
    if name == "atk_tensor_k":
        module = ATk(torch.tensor([[1, 3, 2], [4, 2, 1]]), dim=1)
    else:
        module = AGGREGATES[name](2, dim=1).double()
    assert torch.autograd.gradcheck(module, (losses,))


@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_half_precision_is_the_float32_result_rounded_once(name, dtype):
    """Tolerance: the half result equals the float32 computation on the same (half) losses rounded to
    the half dtype, value and gradient, so it lies within half an ulp of float32 (rtol = eps/2)."""
    losses = distinct(SHAPE, seed=6, dtype=torch.float32).to(dtype)
    value, grad = value_and_grad(AGGREGATES[name](2, dim=1), losses)
    value32, grad32 = value_and_grad(AGGREGATES[name](2, dim=1), losses.float())
    assert value.dtype == grad.dtype == dtype
    assert torch.equal(value, value32.to(dtype)) and torch.equal(grad, grad32.to(dtype))
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(value.float(), value32, rtol=eps / 2, atol=0)


def spy_batched(module):
    """Record the k each call of ``module`` hands its batched kernel."""
    seen, batched = [], module.batched
    module.batched = lambda losses, k, lam, delta, **options: (
        seen.append(k),
        batched(losses, k, lam, delta, **options),
    )[1]
    return seen


@pytest.mark.parametrize("k", [700, 701])  # 701 is not a bfloat16 number (it rounds to 700); 700 is
@pytest.mark.parametrize("kernel", ["eager", "native"])
@pytest.mark.parametrize("cls", [MATk, STk])
def test_bfloat16_thresholded_losses_use_the_exact_k(cls, kernel, k):
    """n = 1000 bfloat16 losses, k = 700 or 701: the k each kernel gets is exact in float32, λ's gradient
    (k/n − the smoothed share above λ) shows the kernel used it, and value and gradient are the float32
    ones (tolerance: the value rounded once to bfloat16, λ's gradient, in float32, equal)."""
    losses = torch.linspace(0.0, 3.0, 1000).to(torch.bfloat16)
    module, reference = (cls(k, lam_update="gradient", lam_init=1.5, kernel=kernel) for _ in range(2))
    seen = spy_batched(module)
    value, value32 = module(losses), reference(losses.float())
    value.backward()
    value32.backward()
    assert seen[0].dtype == torch.float32 and seen[0].tolist() == [float(k)]
    assert value.dtype == torch.bfloat16 and torch.equal(value, value32.to(torch.bfloat16))
    assert torch.equal(module.lam.grad, reference.lam.grad)
    if cls is MATk:  # ReLU's share above λ is the count of losses above it
        above = int((losses.float() > 1.5).sum())
        assert module.lam.grad.item() == pytest.approx((k - above) / 1000, abs=1e-6)


@pytest.mark.parametrize("k", [700, 701])
def test_bfloat16_atk_and_soft_atk_rows_use_the_exact_k(k):
    """The top 700 of n = 1000 losses are 0, the rest −256: ATk(701) = −256/701, ATk(700) = 0."""
    row = torch.cat([torch.zeros(700), torch.full((300,), -256.0)])
    losses = torch.stack([row, row.flip(0)]).to(torch.bfloat16)
    expected = torch.tensor(-256.0 / k if k > 700 else 0.0).to(torch.bfloat16)
    for module in (ATk(k), ATk(torch.tensor([k, k]))):
        assert torch.equal(module(losses), expected.expand(2))
    operator = LapSum(alpha=0.5)
    counts, soft_topk = [], operator.soft_topk
    operator.soft_topk = lambda scores, count: (counts.append(count), soft_topk(scores, count))[1]
    value = SoftATk(k, operator)(losses)
    assert counts == [k] and torch.equal(value, SoftATk(k, operator)(losses.float()).to(torch.bfloat16))


@pytest.mark.parametrize("path", ["eager", "native"])
def test_the_batched_kernel_carries_k_in_float32_for_bfloat16_rows(path):
    """The population's form: (P, n) bfloat16 rows, k in float32; the value is that of float32 rows."""
    losses = torch.linspace(0.0, 3.0, 2000).reshape(2, 1000).to(torch.bfloat16)
    k, lam = torch.tensor([701.0, 513.0]), torch.tensor([1.5, 0.25], requires_grad=True)
    module = STk(1, kernel=path)
    value = module.batched(losses, k, lam, torch.full((2,), 0.01))
    (grad_lam,) = torch.autograd.grad(value.sum(), lam)
    lam32 = lam.detach().clone().requires_grad_()
    value32 = module.batched(losses.float(), k, lam32, torch.full((2,), 0.01))
    (grad_lam32,) = torch.autograd.grad(value32.sum(), lam32)
    assert value.dtype == torch.bfloat16 and torch.equal(value, value32.to(torch.bfloat16))
    assert torch.equal(grad_lam, grad_lam32)


def test_solve_gives_each_row_its_root_and_stores_their_mean():
    losses = torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 4.0, 0.0, 0.0], [9.0, 8.0, 7.0, 6.0]])
    module = MATk(k=2)
    value = module(losses)
    roots = torch.tensor([3.0, 4.0, 8.0])
    torch.testing.assert_close(value, 0.5 * ATk(2)(losses))  # (k/n)·ATk, each row at its own k-th largest
    torch.testing.assert_close(module.lam_last, roots.mean())
    module.eval()
    torch.testing.assert_close(module(losses), MATk(2, lam_update="gradient", lam_init=5.0)(losses))


def test_a_trained_lambda_is_shared_by_the_rows():
    losses = distinct((3, 6), seed=7)
    module = STk(k=2, lam_update="gradient", lam_init=1.2).double()
    module(losses).sum().backward()
    rows = []
    for row in losses:
        alone = STk(k=2, lam_update="gradient", lam_init=1.2).double()
        alone(row).backward()
        rows.append(alone.lam.grad)
    torch.testing.assert_close(module.lam.grad, torch.stack(rows).sum())


def test_a_pooled_start_for_a_shared_lambda():
    """lam_init="auto" under "gradient": the k-th largest of all rows' losses at the sum of their counts."""
    losses = torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 6.0, 2.0, 7.0]])
    module = MATk(k=2, lam_update="gradient")
    module(losses)
    assert module.threshold.item() == 4.0  # the 4th largest of the 8


@pytest.mark.parametrize("cls", [MATk, STk])
def test_a_module_built_for_its_rows_trains_a_lambda_per_row(cls):
    """rows=3 under "gradient": each row's value and λ gradient are those of the row alone at its own λ."""
    losses = distinct((3, 6), seed=9)
    lams = [0.5, 1.0, 2.0]
    module = cls(k=2, lam_update="gradient", lam_init=0.0, rows=3, dim=0).double()
    with torch.no_grad():
        module.lam.copy_(torch.tensor(lams))
    value = module(losses.T)  # dim=0: the rows are the columns
    value.sum().backward()
    for row, lam in enumerate(lams):
        alone = cls(k=2, lam_update="gradient", lam_init=lam).double()
        alone_value = alone(losses[row])
        alone_value.backward()
        torch.testing.assert_close(value[row], alone_value, rtol=1e-12, atol=0)
        torch.testing.assert_close(module.lam.grad[row], alone.lam.grad, rtol=1e-12, atol=0)


def test_a_module_built_for_its_rows_starts_and_keeps_each_rows_lambda():
    losses = torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 6.0, 2.0, 7.0]])
    trained = MATk(k=2, lam_update="gradient", rows=2)
    trained(losses)
    assert trained.threshold.tolist() == [3.0, 6.0]  # lam_init="auto": each row's 2nd largest
    solved = STk(k=2, rows=2, solve_steps=30)
    value = solved(losses)
    roots = solved.lam_last.clone()
    assert roots.shape == (2,) and torch.equal(solved.lam, roots)  # the first call's running average: the roots
    torch.testing.assert_close(solved.eval()(losses), value.detach())  # outside training: each row's own λ
    assert repr(solved).endswith(", rows=2)")


def test_a_module_built_for_its_rows_refuses_another_row_count():
    module = STk(k=2, lam_update="gradient", lam_init=0.5, rows=3)
    with pytest.raises(
        AggregateInputError, match="was built with rows=3 \\(a λ per row\\), but losses of shape"
    ) as caught:
        module(torch.rand(4, 5))
    assert "\n" not in str(caught.value)
    with pytest.raises(AggregateInputError, match="have 1 rows; pass 3 rows"):
        module(torch.rand(5))
    with pytest.raises(ValueError, match="rows"):
        MATk(k=2, rows=0)


def test_kth_largest_of_rows_by_selection_by_topk_and_by_a_per_row_sort_agree():
    """The rows' k-th largest loss three ways (CPU kthvalue, CUDA's topk, a tensor k's sort), with
    ties, ±inf and NaN (the largest), as kthvalue along the last axis gives it."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        rows, n = (int(v) for v in torch.randint(1, 8, (2,), generator=generator))
        x = torch.randint(-3, 4, (rows, n), generator=generator).float()
        draw = torch.rand(rows, n, generator=generator)
        x[draw < 0.1], x[(draw >= 0.1) & (draw < 0.2)], x[(draw >= 0.2) & (draw < 0.25)] = INF, -INF, NAN
        for k in range(1, n + 1):
            expected = x.kthvalue(n + 1 - k, -1).values.nan_to_num(7.0)
            assert torch.equal(kth_largest_value(x, k, by_topk=True).nan_to_num(7.0), expected), (x, k)
            by_sort = kth_largest(x, torch.full((rows,), float(k)))
            assert torch.equal(by_sort.nan_to_num(7.0), kth_largest(x, k).nan_to_num(7.0)), (x, k)


def test_a_nan_loss_makes_its_row_nan_and_leaves_the_others():
    losses = distinct((3, 5), seed=8)
    losses[1, 2] = float("nan")
    for name in AGGREGATES:
        module = AGGREGATES[name](2).double()
        value = module(losses)
        assert value[1].isnan() and value[[0, 2]].isfinite().all(), name
        if getattr(module, "lam_update", None) == "solve":
            assert module.lam_last.isfinite(), name


BAD_LOSSES = [
    (torch.ones(2, 4, dtype=torch.int64), -1, "floating-point losses, got torch.int64; convert them"),
    (torch.ones(2, 4, dtype=torch.bool), -1, "floating-point losses, got torch.bool"),
    (torch.ones(()), -1, "at least a 1-D tensor, got \\(\\)"),
    (torch.ones(2, 0), -1, "cannot aggregate an empty batch of losses \\(n=0\\)"),
    (torch.ones(0, 3), -1, "losses of shape \\(0, 3\\) hold no rows"),
    (torch.ones(2, 4), 2, "dim=2 is out of range for losses of shape \\(2, 4\\); use a dim in \\[-2, 1\\]"),
]


@pytest.mark.parametrize("losses,dim,match", BAD_LOSSES)
@pytest.mark.parametrize("name", list(AGGREGATES))
def test_bad_losses_are_one_line_errors(name, losses, dim, match):
    with pytest.raises(AggregateInputError, match=match) as caught:
        AGGREGATES[name](1, dim=dim)(losses)
    assert isinstance(caught.value, TopklabError) and isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", WITH_K)
def test_k_out_of_range_is_a_one_line_error(name):
    cases = [
        (5, "k=5 exceeds the number of losses n=4; use k <= n"),
        (torch.tensor([1, 7]), "k=7 exceeds the number of losses n=4"),
        (torch.tensor([1, 2, 3]), "k of shape \\(3,\\) does not fit losses with rows of shape \\(2,\\)"),
    ]
    for k, match in cases:
        with pytest.raises(AggregateInputError, match=match) as caught:
            AGGREGATES[name](k)(torch.ones(2, 4))
        assert "\n" not in str(caught.value)
    for k, match in [
        (torch.tensor([0, 2]), "each >= 1"),
        (torch.tensor([0.5, 1.5]), "each in \\(0, 1\\]"),
        (torch.tensor([True]), "torch.bool"),
    ]:
        with pytest.raises(AggregateInputError, match=match):
            AGGREGATES[name](k)


def test_dim_must_be_an_int():
    with pytest.raises(AggregateInputError, match="dim=1.0 must be an int"):
        ATk(2, dim=1.0)


def test_dim_shows_in_the_repr_only_when_set():
    assert repr(ATk(2)) == "ATk(k=2, method='topk')" and repr(Average(dim=0)) == "Average(dim=0)"
    assert repr(STk(2, dim=1)).endswith("track_from=None, dim=1)")


@pytest.mark.slow
@pytest.mark.parametrize("cls", [STk, MATk])
def test_batched_rows_compile_as_one_graph(cls):
    """Rows reduced over dim=1 under torch.compile(fullgraph=True): the same values and gradients as eager."""
    torch._dynamo.reset()
    compiled_loss, eager_loss = cls(k=0.5, dim=1), cls(k=0.5, dim=1)
    compiled = torch.compile(lambda values: compiled_loss(values), fullgraph=True, backend="aot_eager")
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        losses = torch.rand(3, 16, 2, generator=generator)
        a, b = losses.clone().requires_grad_(True), losses.clone().requires_grad_(True)
        value_a, value_b = compiled(a), eager_loss(b)
        value_a.sum().backward()
        value_b.sum().backward()
        torch.testing.assert_close(value_a, value_b)
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.slow
def test_bfloat16_compiled_kernel_uses_the_exact_k():
    """The compiled kernel path (the GPU's default) on n = 1000 bfloat16 losses with k = 701 against the
    eager kernel on float32 losses: the value within one bfloat16 ulp (the two agree to float32
    rounding before the one rounding to bfloat16), λ's gradient to 1e-6 (k/n moves it by 1e-3)."""
    losses = torch.linspace(0.0, 3.0, 1000).to(torch.bfloat16)
    module, reference = (STk(701, lam_update="gradient", lam_init=1.5, kernel=path) for path in ("compiled", "eager"))
    value, value32 = module(losses), reference(losses.float())
    value.backward()
    value32.backward()
    torch.testing.assert_close(value.float(), value32.to(torch.bfloat16).float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(module.lam.grad, reference.lam.grad, rtol=0, atol=1e-6)
