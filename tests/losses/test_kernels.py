"""The fused kernels of MATk/STk (topklab.losses.aggregate.kernels): eager gradients equal autograd
of the elementwise formula bit for bit, float64 gradcheck, the compiled kernel equals the eager one
to float32 rounding, and the compiler's failure, dynamic shapes and retain_graph are handled."""

import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate import kernels
from topklab.losses.aggregate.kernels import compiled, thresholded
from topklab.smoothing import SMOOTHINGS
from topklab.utils.errors import TopklabError

SMOOTH = sorted(SMOOTHINGS)


def rows(P=4, n=61, dtype=torch.float32, seed=0):
    """(losses, λ, δ, k, scale) for P rows: λ inside the losses' range, one δ and k per row."""
    g = torch.Generator().manual_seed(seed)
    losses = (torch.randn(P, n, generator=g, dtype=dtype) * 2).requires_grad_()
    lam = torch.linspace(-0.5, 1.5, P, dtype=dtype).requires_grad_()
    delta = torch.logspace(-3, -0.5, P, dtype=dtype)
    k = torch.linspace(1, n, P, dtype=dtype).round()
    return losses, lam, delta, k, n / k


def formula(losses, lam, delta, k, scale, phi):
    """The aggregate written elementwise, for autograd: s·[mean φ(ℓ − λ) + (k/n)·λ]."""
    n = losses.shape[1]
    return (phi(losses - lam[:, None], delta[:, None]).mean(1) + k / n * lam) * scale


@pytest.mark.parametrize("smoothing", SMOOTH)
@pytest.mark.parametrize("paper_scale", [True, False])
def test_eager_gradients_are_autograds_of_the_formula_bit_for_bit(smoothing, paper_scale):
    losses, lam, delta, k, scale = rows()
    if paper_scale:
        scale = torch.ones_like(k)
    phi = SMOOTHINGS[smoothing]
    fused = thresholded(losses, lam, delta, k, scale, phi)
    reference = formula(losses, lam, delta, k, scale, phi)
    torch.testing.assert_close(fused, reference, rtol=1e-6, atol=1e-7)
    got = torch.autograd.grad(fused.sum(), (losses, lam))
    want = torch.autograd.grad(reference.sum(), (losses, lam))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("smoothing", SMOOTH)
def test_eager_gradcheck_float64(smoothing):
    losses, lam, delta, k, scale = rows(P=3, n=13, dtype=torch.float64, seed=1)
    phi = SMOOTHINGS[smoothing]
    assert torch.autograd.gradcheck(lambda values, t: thresholded(values, t, delta, k, scale, phi), (losses, lam))


def test_upstream_gradient_scales_every_row():
    losses, lam, delta, k, scale = rows(dtype=torch.float64, seed=2)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    phi = SMOOTHINGS["srelu"]
    got = torch.autograd.grad((thresholded(losses, lam, delta, k, scale, phi) * weights).sum(), (losses, lam))
    want = torch.autograd.grad((formula(losses, lam, delta, k, scale, phi) * weights).sum(), (losses, lam))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("smoothing", SMOOTH)
def test_value_without_gradients_is_the_formulas(smoothing):
    losses, lam, delta, k, scale = rows(seed=3)
    phi = SMOOTHINGS[smoothing]
    with torch.no_grad():
        plain = thresholded(losses, lam, delta, k, scale, phi)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, formula(losses, lam, delta, k, scale, phi).detach(), rtol=1e-6, atol=1e-7)


def test_retain_graph_backward_twice_recomputes_and_double_backward_is_refused():
    losses, lam, delta, k, scale = rows(seed=4)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])  # not all ones: the backward scales the stored gradients
    value = (thresholded(losses, lam, delta, k, scale, SMOOTHINGS["srelu"]) * weights).sum()
    value.backward(retain_graph=True)
    once = losses.grad.clone(), lam.grad.clone()
    value.backward()
    for twice, single in zip((losses.grad, lam.grad), once):
        torch.testing.assert_close(twice, 2 * single, rtol=1e-6, atol=0)
    (grad,) = torch.autograd.grad(
        thresholded(losses, lam, delta, k, scale, SMOOTHINGS["srelu"]).sum(), losses, create_graph=True
    )
    with pytest.raises(RuntimeError, match="does not require grad"):  # its gradient is not differentiable
        grad.sum().backward()


def test_gradient_only_where_asked_and_constants_must_not_need_one():
    losses, lam, delta, k, scale = rows(seed=11)
    fixed = losses.detach()
    (grad_lam,) = torch.autograd.grad(thresholded(fixed, lam, delta, k, scale, SMOOTHINGS["relu"]).sum(), lam)
    (want,) = torch.autograd.grad(formula(fixed, lam, delta, k, scale, SMOOTHINGS["relu"]).sum(), lam)
    assert torch.equal(grad_lam, want)
    with pytest.raises(ValueError, match="delta, scale of a thresholded aggregate are constants"):
        thresholded(losses, lam, delta.requires_grad_(), k, scale.requires_grad_(), SMOOTHINGS["srelu"])


def test_srelu_without_a_width_is_refused():
    with pytest.raises(ValueError, match="smoothing='srelu' needs a width delta > 0 for every row; got None"):
        STk(2).batched(torch.rand(2, 5), torch.tensor([2.0, 2.0]), torch.zeros(2), None)


def close_to_float32_rounding(compiled, eager, losses, k, scale):
    """Compiled vs eager: value to 1e-6 relative; gradients to 1e-6 of their terms' magnitude
    (∂/∂ℓ: of s/n, the largest slope; ∂/∂λ: of s·k/n + Σ|∂/∂ℓ|, which cancel at the optimum)."""
    n = losses.shape[1]
    (value_c, grads_c), (value_e, grads_e) = compiled, eager
    torch.testing.assert_close(value_c, value_e, rtol=1e-6, atol=1e-6 * float(value_e.abs().max()))
    assert ((grads_c[0] - grads_e[0]).abs() <= 1e-6 * (scale / n)[:, None]).all()
    assert ((grads_c[1] - grads_e[1]).abs() <= 1e-6 * (scale * k / n + grads_e[0].abs().sum(1))).all()


def evaluate(phi, path, args):
    value = thresholded(*args, phi, path, required=True)  # a kernel that cannot be built fails the test
    return value.detach(), torch.autograd.grad(value.sum(), args[:2])


@pytest.mark.parametrize("path", ["compiled", "native"])
@pytest.mark.parametrize("smoothing", ["srelu", "relu"])
@pytest.mark.parametrize("P,n", [(1, 20011), (3, 517)])
def test_fast_kernels_match_eager(path, smoothing, P, n):
    args = rows(P=P, n=n, seed=5)
    phi = SMOOTHINGS[smoothing]
    close_to_float32_rounding(evaluate(phi, path, args), evaluate(phi, "eager", args), args[0], args[3], args[4])
    with torch.no_grad():
        torch.testing.assert_close(
            thresholded(*args, phi, path, required=True), thresholded(*args, phi), rtol=1e-6, atol=1e-7
        )


@pytest.mark.parametrize("smoothing", ["elu", "softplus", "leaky_relu"])
def test_native_kernel_matches_eager_other_smoothings(smoothing):
    args = rows(P=2, n=3001, seed=6)
    phi = SMOOTHINGS[smoothing]
    close_to_float32_rounding(evaluate(phi, "native", args), evaluate(phi, "eager", args), args[0], args[3], args[4])


def test_native_slopes_of_the_piecewise_linear_smoothings_equal_eager_bit_for_bit():
    """One multiply or none per element: the gradient in the losses is identical (SReLU's differs
    from ATen's in the last bit for some elements; the row sums in their last bits)."""
    for name in ("relu", "leaky_relu"):
        args = rows(P=3, n=1001, seed=13)
        phi = SMOOTHINGS[name]
        assert torch.equal(evaluate(phi, "native", args)[1][0], evaluate(phi, "eager", args)[1][0])


@pytest.mark.parametrize("retain", [False, True])
def test_native_backward_scales_by_the_upstream_gradient(retain):
    losses, lam, delta, k, scale = rows(P=4, n=300, dtype=torch.float64, seed=14)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    phi = SMOOTHINGS["srelu"]
    value = (thresholded(losses, lam, delta, k, scale, phi, "native", required=True) * weights).sum()
    got = torch.autograd.grad(value, (losses, lam), retain_graph=retain)
    if retain:  # the saved gradients are intact for a second pass
        again = torch.autograd.grad(value, (losses, lam))
        assert all(torch.equal(a, b) for a, b in zip(got, again))
    want = torch.autograd.grad((formula(losses, lam, delta, k, scale, phi) * weights).sum(), (losses, lam))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize("smoothing", ["elu", "softplus", "leaky_relu"])
def test_compiled_kernel_matches_eager_other_smoothings(smoothing):
    args = rows(P=2, n=3001, seed=6)
    phi = SMOOTHINGS[smoothing]
    close_to_float32_rounding(evaluate(phi, "compiled", args), evaluate(phi, "eager", args), args[0], args[3], args[4])


@pytest.mark.parametrize("path", [pytest.param("compiled", marks=pytest.mark.slow), "native"])
@pytest.mark.parametrize("smoothing", SMOOTH)
def test_fast_kernels_gradcheck_float64(path, smoothing):
    losses, lam, delta, k, scale = rows(P=2, n=11, dtype=torch.float64, seed=7)
    phi = SMOOTHINGS[smoothing]
    assert torch.autograd.gradcheck(
        lambda values, t: thresholded(values, t, delta, k, scale, phi, path, required=True), (losses, lam)
    )


def test_one_compilation_serves_every_batch_size():
    phi = SMOOTHINGS["srelu"]
    evaluate(phi, "compiled", rows(P=2, n=300, seed=8))
    code = kernels.compiled(phi, True, "cpu", torch.float32, False)._torchdynamo_orig_callable.__code__
    for P, n in ((2, 301), (5, 999), (3, 4097)):
        evaluate(phi, "compiled", rows(P=P, n=n, seed=n))
    assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(code)) == 1


def test_a_kernel_that_cannot_be_built_falls_back_once_or_fails_when_required(monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("CppCompileError: gcc not found\nmore detail")

    monkeypatch.setattr(kernels, "native_extension", broken)
    monkeypatch.setattr(kernels, "compiled", broken)
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    args = rows(P=1, n=40, seed=9)
    phi = SMOOTHINGS["srelu"]
    eager = thresholded(*args, phi)
    with pytest.warns(UserWarning) as caught:
        fallback = thresholded(*args, phi, "native")
    assert [str(w.message).split(" (")[0] for w in caught] == [
        "the native kernel of the thresholded losses failed on cpu",
        "the compiled kernel of the thresholded losses failed on cpu",
    ]
    assert torch.equal(fallback, eager)
    thresholded(*args, phi, "native")  # known to fail: not retried, no second warning
    assert len(calls) == 2 and kernels.compiler_error("native", torch.device("cpu")).startswith("CppCompileError")
    with pytest.raises(TopklabError, match="loss.kernel=compiled, but that kernel failed on cpu: CppCompileError"):
        STk(0.5, kernel="compiled")(args[0][0].detach())  # a failure known from an auto call
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    with pytest.raises(TopklabError, match="loss.kernel=native, but that kernel failed on cpu"):
        STk(0.5, kernel="native")(args[0][0].detach())
    assert kernels.compiler_error("native", torch.device("cpu")) is None  # required: raised, not recorded


def test_an_error_of_the_inputs_is_not_blamed_on_the_kernel(monkeypatch):
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    losses, lam, delta, k, scale = rows(P=3, n=40, seed=12)
    for path in ("native", "compiled"):
        with pytest.raises(RuntimeError, match="size of tensor"):
            thresholded(losses, lam[:2], delta, k, scale, SMOOTHINGS["srelu"], path)
    assert kernels._UNAVAILABLE == {}


def test_auto_sends_long_rows_to_the_fast_kernel():
    short, long_ = torch.rand(1, 100), torch.rand(1, 16384)
    configured = STk(5, compile_min_n=16384)  # the experiment configs' setting
    assert [configured.path_for(short), configured.path_for(long_)] == ["eager", "native"]
    assert STk(5, compile_min_n=50).path_for(short) == "native"
    assert [STk(5).path_for(short), STk(5).path_for(long_)] == ["native", "native"], "default: C++ at every n"
    gpu = STk(5)._chosen_path  # the device type alone decides; no GPU needed to ask
    assert [gpu(100, "cuda"), gpu(16384, "cuda")] == ["eager", "native"], "default on a GPU: compiled from 16384"
    assert [STk(5, kernel=kernel).path_for(long_) for kernel in ("eager", "compiled")] == ["eager", "compiled"]
    assert MATk(5, kernel="native").path_for(short) == "native"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"kernel": "cuda"}, "unknown kernel 'cuda'; choose one of: auto, native, compiled, eager, triton"),
        ({"compile_min_n": 0}, "compile_min_n=0 must be an int >= 1"),
        ({"compile_min_n": 1.5}, "compile_min_n=1.5 must be an int >= 1"),
    ],
)
def test_bad_kernel_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        STk(0.5, **kwargs)


def test_a_kernel_compiled_under_another_vector_set_is_never_reloaded(monkeypatch, tmp_path):
    """Inductor picks its C++ vector set from ``ATEN_CPU_CAPABILITY`` at every compile; a kernel compiled
    under one set and reloaded from the disk cache under another (here, one thread: AVX2 then AVX-512)
    gave 31061.4 for 21057.4 and corrupted the heap. Each compile starts afresh, on one cache folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    args, phi, threads = rows(P=1, n=20011, seed=5), SMOOTHINGS["srelu"], torch.get_num_threads()
    eager = evaluate(phi, "eager", args)
    try:
        torch.set_num_threads(1)
        for capability in ("avx2", None, "default"):
            if capability is None:
                monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
            else:
                monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
            torch._dynamo.reset()
            compiled.cache_clear()
            close_to_float32_rounding(evaluate(phi, "compiled", args), eager, args[0], args[3], args[4])
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        compiled.cache_clear()
