"""λ solved in C++ (``solve_srelu_threshold(..., path="native")``): the eager solve's root and count,
with its infinities and NaN rows; STk's native path uses it; a failed build falls back or raises."""

import pytest
import torch

from topklab.losses import STk
from topklab.losses.aggregate import kernels
from topklab.losses.aggregate.solve import solve_srelu_threshold
from topklab.utils.errors import TopklabError


def rows(n: int, dtype=torch.float64, seed=0):
    """Three rows of n losses (one with two +inf, one with a −inf), k = 1, n/2, n − 1, δ from 0.01 to 1."""
    g = torch.Generator().manual_seed(seed)
    losses = torch.randn(3, n, generator=g, dtype=dtype) * 3
    losses[1, :2], losses[2, 0] = float("inf"), float("-inf")
    k = torch.tensor([1.0, n // 2, n - 1], dtype=dtype)
    return losses, k, torch.tensor([0.01, 0.1, 1.0], dtype=dtype), torch.zeros(3, dtype=dtype)


@pytest.mark.parametrize("n", [5, 100, 4097])
@pytest.mark.parametrize("steps", [1, 2, 30])
def test_the_native_solve_is_the_eager_one_in_float64(n, steps):
    args = rows(n)
    eager, native = (
        solve_srelu_threshold(*args, steps),
        solve_srelu_threshold(*args, steps, path="native", required=True),
    )
    torch.testing.assert_close(native[0], eager[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(native[1], eager[1], rtol=0, atol=1e-9)


def test_in_float32_the_native_count_is_the_eager_one_to_rounding():
    losses, k, delta, start = rows(4097, torch.float32, seed=3)
    eager, native = (
        solve_srelu_threshold(losses, k, delta, start, 2),
        solve_srelu_threshold(losses, k, delta, start, 2, path="native", required=True),
    )
    assert native[0].dtype == native[1].dtype == torch.float32
    torch.testing.assert_close(native[1], eager[1], rtol=1e-4, atol=0)  # the eager count sums 4,097 float32 terms
    torch.testing.assert_close(native[0], eager[0], rtol=1e-5, atol=1e-6)  # a Newton step scales the count's rounding


def test_a_nan_row_has_no_root_and_the_others_are_solved():
    losses = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    losses[0, 3] = float("nan")
    args = (losses, torch.tensor([5.0, 5.0]), torch.tensor([0.01, 0.01]), torch.zeros(2))
    lam, count = solve_srelu_threshold(*args, 20, path="native", required=True)
    assert lam[0].isnan() and count[0].isnan()
    assert abs(float(count[1]) - 5.0) < 1e-3 and float(lam[1]) == pytest.approx(
        float(solve_srelu_threshold(*args, 20)[0][1]), abs=1e-5
    )


@pytest.mark.parametrize("lam_update", ["solve", "track"])
def test_stk_on_the_native_path_solves_natively_and_tracks_as_the_eager_path(lam_update):
    g = torch.Generator().manual_seed(2)
    native, eager = (STk(k=0.3, kernel=kernel, lam_update=lam_update) for kernel in ("native", "eager"))
    for step in range(5):  # losses that fall: λ follows them on both paths
        losses = (torch.rand(3000, generator=g, dtype=torch.float64) * 4 + 3 - step).requires_grad_()
        torch.testing.assert_close(native(losses), eager(losses), rtol=0, atol=1e-12)
        torch.testing.assert_close(native.lam_last, eager.lam_last, rtol=0, atol=1e-10)
    # solve: in band on every call; track steps from the last batch's λ, a quarter of the spread behind here
    assert native.monitor.pop_epoch()["lam_in_band_all"] == (1.0 if lam_update == "solve" else 0.2)


def test_a_native_solve_that_cannot_be_built_falls_back_once_or_raises_when_required(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CppCompileError: gcc not found")

    monkeypatch.setattr(kernels, "native_extension", broken)
    monkeypatch.setattr(kernels, "_UNAVAILABLE", {})
    args = rows(60)
    with pytest.raises(TopklabError, match="loss.kernel=native, but that kernel failed on cpu: CppCompileError"):
        solve_srelu_threshold(*args, 2, path="native", required=True)
    assert kernels.compiler_error("native", torch.device("cpu")) is None  # required: raised, not recorded
    with pytest.warns(UserWarning, match="solving λ with the eager torch operations instead"):
        fallback = solve_srelu_threshold(*args, 2, path="native")
    assert all(torch.equal(a, b) for a, b in zip(fallback, solve_srelu_threshold(*args, 2)))
    assert kernels.compiler_error("native", torch.device("cpu")).startswith("CppCompileError")
