"""The Triton launches on every layout a caller may hand them, as properties over generated inputs: one row
contiguous or strided (``x[:, 0]``), rows contiguous, transposed or sliced, reduced by ``.sum()`` (an
expanded incoming gradient), ``.mean()`` or a weighted sum, and two backwards through one call
(``retain_graph``); in float32 and bfloat16, tracked and solved, STk and MATk. The torch path on the same
inputs is the reference. Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from topklab.losses import MATk, STk

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODULES = {
    "stk track": lambda rows: STk(k=0.3, delta=0.05, lam_update="track", rows=rows, kernel="triton"),
    "matk track": lambda rows: MATk(k=0.3, lam_update="track", rows=rows, kernel="triton"),
    "stk solve": lambda rows: STk(k=0.3, delta=0.05, lam_update="solve", rows=rows, kernel="triton"),
    "matk solve": lambda rows: MATk(k=0.3, lam_update="solve", rows=rows, kernel="triton"),
}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
ONE_ROW = ("contiguous", "strided")  # a (n,) tensor, or a column of an (n, 2) one
ROWS = ("contiguous", "transposed", "sliced")  # (P, n): as made, an (n, P) one transposed, every other column
REDUCTIONS = ("sum", "mean", "weighted")


def laid_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """``values`` (n,) or (P, n), equal in value, in ``layout``."""
    if values.dim() == 1:
        return values.clone() if layout == "contiguous" else torch.stack([values, -values], 1)[:, 0]
    if layout == "transposed":
        return values.t().contiguous().t()
    if layout == "sliced":
        wide = torch.zeros(values.shape[0], 2 * values.shape[1], dtype=values.dtype, device=values.device)
        wide[:, ::2] = values
        return wide[:, ::2]
    return values.clone()


def reduced(value: torch.Tensor, how: str) -> torch.Tensor:
    if value.dim() == 0:
        return value * 0.37 if how == "weighted" else value
    if how == "sum":
        return value.sum()
    if how == "mean":
        return value.mean()
    return (value * weights(value.shape[0], value)).sum()


def weights(rows: int, like: torch.Tensor) -> torch.Tensor:
    return torch.linspace(0.5, 2.0, rows, dtype=like.dtype, device=like.device)


def incoming(value: torch.Tensor, how: str) -> torch.Tensor:
    """∂(reduced value)/∂value, contiguous, as :func:`reduced` would pass it."""
    if value.dim() == 0:
        return torch.tensor(0.37 if how == "weighted" else 1.0, dtype=value.dtype, device=value.device)
    if how == "sum":
        return torch.ones_like(value)
    if how == "mean":
        return torch.full_like(value, 1.0 / value.shape[0])
    return weights(value.shape[0], value)


def gradients(module, losses: torch.Tensor, how: str, backwards: int):
    """The value of one training call and ∂(reduced value)/∂losses from each of ``backwards`` backwards."""
    leaf = losses.detach().requires_grad_()
    value = module(leaf)
    out = reduced(value, how)
    grads = [torch.autograd.grad(out, leaf, retain_graph=i + 1 < backwards)[0] for i in range(backwards)]
    return value.detach(), grads


def plain_gradient(module, losses: torch.Tensor, how: str):
    """The same on contiguous losses with the incoming gradient handed over as a contiguous tensor."""
    leaf = losses.detach().clone().requires_grad_()
    value = module(leaf)
    (grad,) = torch.autograd.grad(value, leaf, incoming(value.detach(), how))
    return value.detach(), grad


LAYOUT_CASES = dict(
    name=st.sampled_from(sorted(MODULES)),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    rows=st.sampled_from([None, 3]),
    layout=st.data(),
    how=st.sampled_from(REDUCTIONS),
    n=st.integers(17, 300),
    spread=st.floats(0.01, 1000.0),
    seed=st.integers(0, 2**16),
    backwards=st.sampled_from([1, 2]),
)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(**LAYOUT_CASES)
def test_every_layout_and_incoming_gradient_matches_the_torch_path(**case):
    matches_on_every_layout(**case)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(**LAYOUT_CASES)
def test_every_layout_and_incoming_gradient_matches_the_torch_path_on_many_more_draws(**case):
    matches_on_every_layout(**case)


def matches_on_every_layout(name, dtype, rows, layout, how, n, spread, seed, backwards):
    generator = torch.Generator().manual_seed(seed)
    shape = (n,) if rows is None else (rows, n)
    layout = layout.draw(st.sampled_from(ONE_ROW if rows is None else ROWS))
    fused = MODULES[name](rows).to(DEVICE)
    fused((torch.rand(shape, generator=generator) * spread).to(dtype).to(DEVICE))  # λ started on the torch path
    same = copy.deepcopy(fused)  # the same launches on contiguous losses, a contiguous incoming gradient
    torch_path = copy.deepcopy(fused)
    torch_path._on_device_pass = False
    tolerance = TOLERANCE[dtype]
    for call in range(2):
        values = (torch.rand(shape, generator=generator) * spread).to(dtype).to(DEVICE)
        value, grads = gradients(fused, laid_out(values, layout), how, backwards)
        want, want_grad = plain_gradient(same, values, how)
        assert torch.equal(value, want) and torch.equal(fused.lam_last, same.lam_last)
        for grad in grads:  # each backward: the same gradient, never scaled twice
            assert torch.equal(grad, want_grad)
        # the torch path from the same λ: the first call (the next λ of each path is its own to float rounding,
        # which a steep smoothing at a large loss scale amplifies); a solved STk λ is a root to the solve's tolerance
        if call == 0 and name != "stk solve":
            want, want_grad = plain_gradient(torch_path, values, how)
            torch.testing.assert_close(value.float(), want.float(), rtol=tolerance, atol=tolerance * spread)
            torch.testing.assert_close(grads[0].float(), want_grad.float(), rtol=tolerance, atol=tolerance / n)


def test_the_saved_gradient_is_never_what_the_caller_holds():
    """Two backwards with g = 1 and g = 0.5: the second reads the saved gradient unscaled, and the first's
    result is not the saved buffer (scaling it in place would change what the caller holds)."""
    module = STk(k=0.3, delta=0.05, lam_update="track", kernel="triton").to(DEVICE)
    module(torch.rand(64, device=DEVICE))
    leaf = torch.rand(64, device=DEVICE).requires_grad_()
    value = module(leaf)
    (first,) = torch.autograd.grad(value, leaf, retain_graph=True)
    kept = first.clone()
    (second,) = torch.autograd.grad(value * 0.5, leaf)
    torch.testing.assert_close(second, 0.5 * kept)
    assert torch.equal(first, kept)
