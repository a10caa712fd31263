"""Average and ATk on one row of CPU losses as one C++ node (``thresholded_cpu.cpp``'s ``top_mean_row``):
the torch expression's value and gradient bit for bit (``x.mean()``, ``x.topk(k).values.mean()``), under an
incoming gradient of one (the gradient made in the forward) and any other (autograd's chain recomputed), and
the torch expression itself where no extension is prebuilt or loaded (never a build for these two) and where
something watches the call (forward AD, tracing, torch.func); double backward through a loss weight."""

from __future__ import annotations

import pytest
import torch

from topklab.losses import ATk
from topklab.losses.aggregate import Average, kernels

pytestmark = pytest.mark.skipif(
    not kernels.native_ready(torch.zeros(1), "skipping the C++ node's tests"), reason="no native kernel here"
)

CASES = {
    "average": (Average, lambda x: x.mean()),
    "atk_count": (lambda: ATk(k=3), lambda x: x.topk(3).values.mean()),
    "atk_fraction": (lambda: ATk(k=0.3), lambda x: x.topk(max(1, int(0.3 * x.shape[0] + 0.5))).values.mean()),
    "atk_all": (lambda: ATk(k=1.0), lambda x: x.topk(x.shape[0]).values.mean()),  # sorted first: not x.mean()
}


def rows(dtype):
    generator = torch.Generator().manual_seed(0)
    for n in (3, 16, 1000, 4097):
        yield torch.randn(n, generator=generator, dtype=dtype) * 1000
        yield torch.randint(0, 3, (n,), generator=generator).to(dtype)  # ties: topk's own choice among them
        yield torch.randn(2 * n, generator=generator, dtype=dtype)[::2]  # a strided row


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_node_is_the_torch_expression_bit_for_bit(case, dtype):
    build, expression = CASES[case]
    module = build()
    for row in rows(dtype):
        for scale in (None, 0.37):  # 0.37: the backward's own chain, g / k scattered, not (1 / k) · g
            ours, plain = row.clone().requires_grad_(True), row.clone().requires_grad_(True)
            value, expected = module(ours), expression(plain)
            assert "RowTopMean" in value.grad_fn.name() and torch.equal(value, expected), (case, row.shape)
            (value if scale is None else value * scale).backward()
            (expected if scale is None else expected * scale).backward()
            assert torch.equal(ours.grad, plain.grad), (case, row.shape, scale)
        with torch.no_grad():
            assert torch.equal(module(row), expression(row))


def test_an_overflowing_sum_leaves_the_node_for_the_mean_without_overflow():
    huge = torch.full((4,), torch.finfo(torch.float32).max, requires_grad=True)
    for module in (Average(), ATk(k=2)):
        value = module(huge)
        assert value == torch.finfo(torch.float32).max and "RowTopMean" not in value.grad_fn.name()


def test_without_a_prebuilt_extension_they_are_the_torch_expression_and_build_nothing(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("Average and ATk must not build the extension")

    monkeypatch.setattr(kernels, "_LOADED", [])
    monkeypatch.setattr(kernels, "_NOT_PREBUILT", [])
    monkeypatch.setattr(kernels, "find_prebuilt", lambda module, source: (None, "it is not installed"))
    monkeypatch.setattr(kernels, "load_native", no_build)
    losses = torch.rand(50, requires_grad=True)
    assert Average()(losses).grad_fn.name() == "MeanBackward0"
    assert ATk(k=5)(losses).grad_fn.name() == "MeanBackward0"
    assert kernels.native_if_loaded() is None


WATCHERS = {
    "forward_ad": lambda module, x: _tangent(module, x),
    "jit_trace": lambda module, x: torch.jit.trace(module, torch.arange(4.0, dtype=x.dtype))(x),
    "func_grad": lambda module, x: torch.func.grad(module)(x),
}


def _tangent(module, x):
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        return fwad.unpack_dual(module(fwad.make_dual(x, torch.linspace(1.0, 2.0, x.shape[0], dtype=x.dtype)))).tangent


@pytest.mark.parametrize("watcher", sorted(WATCHERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tracer_a_tangent_or_a_transform_gets_the_torch_expression(case, watcher):
    """The node is reverse mode only and opaque: where something watches the call (forward AD, torch.jit.trace,
    torch.func), the module runs the torch expression and gives what it gives."""
    build, expression = CASES[case]
    x = torch.tensor([3.0, -1.0, 7.0, 2.0])
    got, want = WATCHERS[watcher](build(), x.clone()), WATCHERS[watcher](expression, x.clone())
    assert torch.equal(got, want), (got, want)


def test_a_gradient_of_the_incoming_gradient_survives_the_hand_over():
    """At an incoming gradient of one the node hands over the gradient it made; under create_graph, where that
    incoming gradient itself requires grad (a loss weight at 1), the chain runs so that it keeps its gradient."""
    for build, expression in CASES.values():
        grads = []
        for aggregate in (build(), expression):
            weight = torch.ones((), requires_grad=True)
            x = torch.arange(4.0, requires_grad=True)
            (gx,) = torch.autograd.grad(weight * aggregate(x) + (x**2).sum(), x, create_graph=True)
            (gx**2).sum().backward()
            grads.append((gx.detach(), weight.grad))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1]), grads


def test_an_incoming_gradient_with_a_pending_negation_is_read_as_its_value():
    """A 0-d gradient whose negation is pending (a view of a conjugate's imaginary part) is -1, not the 1 in memory."""
    for build, expression in CASES.values():
        grads = []
        for aggregate in (build(), expression):
            x = torch.arange(4.0, requires_grad=True)
            incoming = torch.complex(torch.tensor(0.0), torch.tensor(1.0)).conj().imag
            assert incoming.is_neg() and incoming == -1
            aggregate(x).backward(incoming)
            grads.append(x.grad)
        assert torch.equal(grads[0], grads[1]), grads


def test_atk_keeps_a_count_apart_from_a_fraction_of_equal_value():
    from topklab.losses.aggregate.base import check_k

    atk = ATk(k=1)
    assert atk(torch.arange(4.0)) == 3.0
    atk.k = check_k(1.0)  # the whole batch, though 1.0 == 1
    assert atk(torch.arange(4.0)) == 1.5
