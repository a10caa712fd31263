"""The C++ PAV of SparseTopK (``pav_cpu.cpp``) against the Python reference, bit for bit: float64
and float32, ties, constant rows, n = 1, q = 2 and q = 4, many rows in one call; the operator's
mask and gradient on either kernel; the fallback where the extension cannot be built."""

import pytest
import torch

from topklab.operators import sparse_topk
from topklab.operators.sparse_topk import SparseTopK, _compress, isotonic_pav, native_pav
from topklab.utils.errors import TopklabError


def weights(n: int, k: int, dtype=torch.float64) -> torch.Tensor:
    return (torch.arange(n) < k).to(dtype)


def sorted_t(batch: int, n: int, seed: int, scale: float = 1.0, dtype=torch.float64) -> torch.Tensor:
    """Rows as SparseTopK passes them: descending scores over ℓ, squeezed beyond ±4."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, n, generator=g, dtype=torch.float64) * scale
    return _compress(scores.sort(1, descending=True).values).to(dtype)


def assert_same(t: torch.Tensor, w: torch.Tensor, p: float):
    expected = isotonic_pav(t, w, p, kernel="python")
    got = isotonic_pav(t, w, p, kernel="native")
    assert got[0].dtype == t.dtype and got[1].dtype == torch.long
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.fixture(scope="module", autouse=True)
def extension():
    return native_pav(required=True)  # built once (cached on disk by torch), or the module fails here


@pytest.mark.parametrize("p", [2, 4 / 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [0.05, 1.0, 20.0])  # most items pooled, some, almost none
def test_native_pav_equals_the_python_reference_bit_for_bit(p, dtype, scale):
    for seed, (batch, n, k) in enumerate([(7, 30, 4), (3, 200, 100), (2, 9, 9), (5, 64, 1)]):
        assert_same(sorted_t(batch, n, seed, scale, dtype), weights(n, k, dtype), p)


@pytest.mark.parametrize("p", [2, 4 / 3])
def test_ties_constant_rows_and_one_item(p):
    tie = torch.tensor([[3.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, -2.0]], dtype=torch.float64)
    assert_same(tie, weights(8, 3), p)  # a tie group across the k-th item
    assert_same(tie, weights(8, 1), p)
    for n, k in [(1, 1), (6, 2), (6, 6)]:
        for value in (0.0, 2.5, -4.0):
            assert_same(torch.full((2, n), value, dtype=torch.float64), weights(n, k), p)
    staircase = torch.tensor([[1.0, 1.0, 0.0, 0.0, -1.0, -1.0]], dtype=torch.float64)  # t − w ties across blocks
    assert_same(staircase, weights(6, 2), p)
    assert_same(staircase, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64), p)


def test_many_rows_in_one_call_equal_row_by_row():
    t, w = sorted_t(300, 50, seed=11), weights(50, 10)  # enough rows for the C++ loop to split them across threads
    values, blocks = isotonic_pav(t, w, 2, kernel="native")
    for row in (0, 149, 299):
        one = isotonic_pav(t[row : row + 1], w, 2, kernel="python")
        assert torch.equal(values[row : row + 1], one[0]) and torch.equal(blocks[row : row + 1], one[1])


def test_empty_batch():
    values, blocks = isotonic_pav(torch.empty(0, 5, dtype=torch.float64), weights(5, 2), 2, kernel="native")
    assert values.shape == blocks.shape == (0, 5)


def mask_and_gradient(scores: torch.Tensor, k: int, **options) -> dict:
    """{kernel: (mask, ∂⟨mask, r⟩/∂scores)} for a fixed random r."""
    r = torch.randn(scores.shape, generator=torch.Generator().manual_seed(9), dtype=scores.dtype)
    results = {}
    for kernel in ("native", "python"):
        x = scores.clone().requires_grad_()
        mask = SparseTopK(kernel=kernel, **options).soft_topk(x, k)
        (mask * r).sum().backward()
        results[kernel] = (mask.detach(), x.grad)
    return results


@pytest.mark.parametrize("p", [2, 4 / 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ell,k", [(0.3, 8), (0.05, 1), (5.0, 39)])
def test_the_fused_mask_and_gradient_equal_the_python_path_bit_for_bit(p, dtype, ell, k):
    g = torch.Generator().manual_seed(3)
    scores = (torch.randn(6, 40, generator=g, dtype=torch.float64) * 2).to(dtype)
    scores[2, 5:9] = scores[2, 0]  # a tie group
    scores[3, :4] = scores[3].max() + 100.0  # a tie far beyond ±CUT after the squeeze
    got = mask_and_gradient(scores, k, regularization=ell, p=p)
    assert torch.equal(got["native"][0], got["python"][0]) and torch.equal(got["native"][1], got["python"][1])


def test_the_fused_mask_on_extreme_scores_and_many_rows():
    scores = torch.randn(300, 30, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    scores[0, 3], scores[1, :2], scores[2, 5] = float("inf"), -float("inf"), 1e300  # t overflows to inf
    got = mask_and_gradient(scores, 10, regularization=1e-3)
    assert torch.equal(got["native"][0], got["python"][0]) and torch.equal(got["native"][1], got["python"][1])
    half = SparseTopK(0.3).soft_topk(scores[:4].to(torch.bfloat16), 10)  # not fused: the C++ PAV alone
    assert half.dtype == torch.bfloat16 and torch.equal(
        half, SparseTopK(0.3, kernel="python").soft_topk(scores[:4].to(torch.bfloat16), 10)
    )


def test_a_pav_that_cannot_be_built_falls_back_once_or_fails_when_required(monkeypatch):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.setattr(sparse_topk, "_build_native_pav", broken)
    monkeypatch.setattr(sparse_topk, "_NATIVE_FAILURE", {})
    x = torch.randn(3, 12, dtype=torch.float64)
    with pytest.raises(TopklabError, match="kernel='native', but the C[+][+] PAV could not be built: Ninja") as error:
        SparseTopK(0.5, kernel="native").soft_topk(x, 4)
    assert "\n" not in str(error.value)
    with pytest.warns(UserWarning, match=r"the C\+\+ PAV could not be built \(Ninja is required"):
        fallback = SparseTopK(0.5).soft_topk(x, 4)
    assert torch.equal(fallback, SparseTopK(0.5, kernel="python").soft_topk(x, 4))
    SparseTopK(0.5).soft_topk(x, 4)  # known to fail: not retried, no second warning
    assert len(calls) == 2


def test_unknown_kernel_is_a_one_line_error():
    with pytest.raises(ValueError, match="kernel='cuda' is unknown; choose one of auto, native, python") as error:
        SparseTopK(kernel="cuda")
    assert "\n" not in str(error.value)
    assert "kernel='python'" in repr(SparseTopK(kernel="python")) and "kernel" not in repr(SparseTopK(solver="dykstra"))
