"""The fused kernels of MATk/STk (topklab.losses.aggregate.kernels): eager gradients equal autograd
of the elementwise formula bit for bit, float64 gradcheck, the compiled kernel equals the eager one
to float32 rounding, and the compiler's failure, dynamic shapes and retain_graph are handled."""
import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate import kernels
from topklab.losses.aggregate.kernels import thresholded
from topklab.losses.smoothing import SMOOTHINGS
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
    fused = thresholded(losses, lam, delta, k, scale, phi, use_compiled=False)
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
    assert torch.autograd.gradcheck(lambda l, t: thresholded(l, t, delta, k, scale, phi, use_compiled=False),
                                    (losses, lam))


def test_upstream_gradient_scales_every_row():
    losses, lam, delta, k, scale = rows(dtype=torch.float64, seed=2)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    phi = SMOOTHINGS["srelu"]
    got = torch.autograd.grad((thresholded(losses, lam, delta, k, scale, phi, False) * weights).sum(), (losses, lam))
    want = torch.autograd.grad((formula(losses, lam, delta, k, scale, phi) * weights).sum(), (losses, lam))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("smoothing", SMOOTH)
def test_value_without_gradients_is_the_formulas(smoothing):
    losses, lam, delta, k, scale = rows(seed=3)
    phi = SMOOTHINGS[smoothing]
    with torch.no_grad():
        plain = thresholded(losses, lam, delta, k, scale, phi, False)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, formula(losses, lam, delta, k, scale, phi).detach(), rtol=1e-6, atol=1e-7)


def test_retain_graph_backward_twice_recomputes_and_double_backward_is_refused():
    losses, lam, delta, k, scale = rows(seed=4)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])  # not all ones: the backward scales the stored gradients
    value = (thresholded(losses, lam, delta, k, scale, SMOOTHINGS["srelu"], False) * weights).sum()
    value.backward(retain_graph=True)
    once = losses.grad.clone(), lam.grad.clone()
    value.backward()
    for twice, single in zip((losses.grad, lam.grad), once):
        torch.testing.assert_close(twice, 2 * single, rtol=1e-6, atol=0)
    (grad,) = torch.autograd.grad(thresholded(losses, lam, delta, k, scale, SMOOTHINGS["srelu"], False).sum(), losses,
                                  create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad"):  # its gradient is not differentiable
        grad.sum().backward()


def test_gradient_only_where_asked_and_constants_must_not_need_one():
    losses, lam, delta, k, scale = rows(seed=11)
    fixed = losses.detach()
    (grad_lam,) = torch.autograd.grad(thresholded(fixed, lam, delta, k, scale, SMOOTHINGS["relu"], False).sum(), lam)
    (want,) = torch.autograd.grad(formula(fixed, lam, delta, k, scale, SMOOTHINGS["relu"]).sum(), lam)
    assert torch.equal(grad_lam, want)
    with pytest.raises(ValueError, match="delta, scale of a thresholded aggregate are constants"):
        thresholded(losses, lam, delta.requires_grad_(), k, scale.requires_grad_(), SMOOTHINGS["srelu"], False)


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


def evaluate(phi, use_compiled, args):
    value = thresholded(*args, phi, use_compiled, required=use_compiled)  # a compiler failure fails the test
    return value.detach(), torch.autograd.grad(value.sum(), args[:2])


@pytest.mark.parametrize("smoothing", ["srelu", "relu"])
@pytest.mark.parametrize("P,n", [(1, 20011), (3, 517)])
def test_compiled_kernel_matches_eager(smoothing, P, n):
    args = rows(P=P, n=n, seed=5)
    phi = SMOOTHINGS[smoothing]
    close_to_float32_rounding(evaluate(phi, True, args), evaluate(phi, False, args), args[0], args[3], args[4])
    with torch.no_grad():
        torch.testing.assert_close(thresholded(*args, phi, True, required=True), thresholded(*args, phi, False),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("smoothing", ["elu", "softplus", "leaky_relu"])
def test_compiled_kernel_matches_eager_other_smoothings(smoothing):
    args = rows(P=2, n=3001, seed=6)
    phi = SMOOTHINGS[smoothing]
    close_to_float32_rounding(evaluate(phi, True, args), evaluate(phi, False, args), args[0], args[3], args[4])


@pytest.mark.slow
@pytest.mark.parametrize("smoothing", ["srelu", "relu"])
def test_compiled_gradcheck_float64(smoothing):
    losses, lam, delta, k, scale = rows(P=2, n=11, dtype=torch.float64, seed=7)
    phi = SMOOTHINGS[smoothing]
    assert torch.autograd.gradcheck(lambda l, t: thresholded(l, t, delta, k, scale, phi, True, required=True),
                                    (losses, lam))


def test_one_compilation_serves_every_batch_size():
    phi = SMOOTHINGS["srelu"]
    evaluate(phi, True, rows(P=2, n=300, seed=8))
    code = kernels.compiled(phi, True, "cpu", torch.float32, False)._torchdynamo_orig_callable.__code__
    for P, n in ((2, 301), (5, 999), (3, 4097)):
        evaluate(phi, True, rows(P=P, n=n, seed=n))
    assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(code)) == 1


def test_compiler_failure_falls_back_once_or_fails_when_required(monkeypatch):
    calls = []

    def broken(phi, with_grads, device_type, dtype, single_row):
        def run(*args):
            calls.append(1)
            raise RuntimeError("CppCompileError: gcc not found\nmore detail")
        return run

    monkeypatch.setattr(kernels, "compiled", broken)
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    args = rows(P=1, n=40, seed=9)
    phi = SMOOTHINGS["srelu"]
    eager = thresholded(*args, phi, False)
    with pytest.warns(UserWarning, match="torch.compile failed on cpu \\(CppCompileError: gcc not found\\)"):
        fallback = thresholded(*args, phi, True)
    assert torch.equal(fallback, eager)
    thresholded(*args, phi, True)  # known to fail: not retried, no second warning
    assert len(calls) == 1 and kernels.compiler_error(torch.device("cpu")).startswith("CppCompileError")
    with pytest.raises(TopklabError, match="loss.kernel=compiled, but torch.compile failed on cpu: CppCompileError"):
        STk(0.5, kernel="compiled")(args[0][0].detach())  # a failure known from an auto call
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    with pytest.raises(TopklabError, match="loss.kernel=compiled, but torch.compile failed on cpu"):
        STk(0.5, kernel="compiled")(args[0][0].detach())
    assert kernels.compiler_error(torch.device("cpu")) is None  # required: raised, not recorded


def test_an_error_of_the_inputs_is_not_blamed_on_the_compiler(monkeypatch):
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    losses, lam, delta, k, scale = rows(P=3, n=40, seed=12)
    with pytest.raises(RuntimeError, match="size of tensor"):
        thresholded(losses, lam[:2], delta, k, scale, SMOOTHINGS["srelu"], True)
    assert kernels.compiler_error(torch.device("cpu")) is None


def test_auto_compiles_long_rows_only(monkeypatch):
    seen = []
    monkeypatch.setattr(kernels, "_run", lambda phi, grads, use_compiled, required, args: seen.append(use_compiled)
                        or kernels.thresholded_value(*args, phi=phi))
    for n in (100, 16384):
        with torch.no_grad():
            STk(5)(torch.rand(n))
            STk(5, kernel="eager")(torch.rand(n))
            MATk(5, kernel="compiled")(torch.rand(n))
    assert seen == [False, False, True, True, False, True]


@pytest.mark.parametrize("kwargs,match", [
    ({"kernel": "triton"}, "unknown kernel 'triton'; choose one of: auto, compiled, eager"),
    ({"compile_min_n": 0}, "compile_min_n=0 must be an integer >= 1"),
    ({"compile_min_n": 1.5}, "compile_min_n=1.5 must be an integer >= 1"),
])
def test_bad_kernel_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        STk(0.5, **kwargs)
