"""Every configured operator takes scores of any shape with ``dim`` (the axis of n; the other axes a
batch of rows) and k as an int, a fraction of n, or a tensor of one k per row. The reference is the operator on
(batch, n) rows laid out by hand, and, where rows do not interact (all but SOFT top-k, which
normalises by the batch maximum, and the seeded Monte-Carlo operator), each row alone in float64."""

import functools

import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONFIG_DIR
from topklab.engine.build import build
from topklab.operators import PerturbedTopK, SinkhornSort, SoftTopKOT

pytestmark = pytest.mark.filterwarnings("ignore:SinkhornSort did not converge")
NAMES = sorted(path.stem for path in (CONFIG_DIR / "operator").glob("*.yaml"))


def fresh(name: str):
    """A newly built operator, torch's generator reseeded: the Monte-Carlo operator draws the same noise."""
    torch.manual_seed(0)
    return build(OmegaConf.load(CONFIG_DIR / "operator" / f"{name}.yaml"), "operator")


configured = functools.cache(fresh)


def alone_tolerance(operator) -> float | None:
    """How close a row computed alone is to the same row in a batch: exact up to rounding, but
    SinkhornSort iterates until every row of the batch has converged (a row alone may stop sooner:
    within its tolerance), and SOFT top-k (the batch maximum) and the Monte-Carlo operator (the
    draws) make rows interact."""
    if isinstance(operator, (SoftTopKOT, PerturbedTopK)):
        return None
    return operator.tol if isinstance(operator, SinkhornSort) else 1e-12


@pytest.mark.parametrize("dim", [1, -1, 0])
@pytest.mark.parametrize("name", NAMES)
def test_any_shape_along_any_dim_is_the_operator_on_its_rows(name, dim):
    operator = fresh(name)
    scores = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    n = scores.shape[dim]
    rows = scores.movedim(dim, -1).reshape(-1, n)
    got = operator.soft_topk(scores, 2, dim=dim)
    assert got.shape == scores.shape and got.dtype == torch.float64
    want = fresh(name).soft_topk(rows, 2).reshape(scores.movedim(dim, -1).shape).movedim(-1, dim)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    tolerance = alone_tolerance(operator)
    if tolerance is not None:
        alone = torch.cat([operator.soft_topk(row[None], 2) for row in rows])
        torch.testing.assert_close(got.movedim(dim, -1).reshape(-1, n), alone, rtol=0, atol=tolerance)
    if operator.gives_permutation:
        permutation = fresh(name).permutation(scores, 2, dim=dim)
        assert permutation.shape == (*scores.movedim(dim, -1).shape, 2)
        torch.testing.assert_close(permutation.reshape(-1, n, 2), fresh(name).permutation(rows, 2), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_one_row_and_a_fraction_of_n(name):
    scores = torch.randn(8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = fresh(name)(scores, 0.3)  # round(0.3 · 8) = 2, half up
    assert got.shape == (8,)
    torch.testing.assert_close(got, fresh(name)(scores[None], 2)[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_tensor_k_is_the_operator_on_each_group_of_rows_sharing_a_k(name):
    """k per row (counts, or fractions broadcast over a batched axis): each group of rows with one k is the
    operator called on those rows at that int k (the groups in ascending k, the Monte-Carlo operator seeded
    once before them), and where rows do not interact, each row alone in float64; a permutation has as many
    columns as the largest k, 0 beyond a row's own."""
    scores = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    counts = torch.tensor([[3, 1, 3], [2, 1, 5]])
    rows, flat = scores.reshape(-1, 7), counts.reshape(-1)
    for output in ("soft_topk", "permutation") if configured(name).gives_permutation else ("soft_topk",):
        got = getattr(fresh(name), output)(scores, counts)
        operator = fresh(name)
        width = int(flat.max())
        want = torch.zeros(6, 7, width, dtype=torch.float64) if output == "permutation" else torch.zeros(6, 7)
        want = want.to(torch.float64)
        for k in sorted(set(flat.tolist())):
            index = (flat == k).nonzero()[:, 0]
            group = getattr(operator, output)(rows[index], k)
            if output == "permutation":
                want[index, :, :k] = group
            else:
                want[index] = group
        assert got.shape == ((2, 3, 7, width) if output == "permutation" else scores.shape)
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0)
        tolerance = alone_tolerance(operator)
        if tolerance is not None:
            for row, k, value in zip(rows, flat.tolist(), got.reshape(want.shape)):
                alone = getattr(operator, output)(row[None], k)[0]
                torch.testing.assert_close(
                    value[..., :k] if output == "permutation" else value, alone, rtol=0, atol=tolerance
                )
    fractions = torch.tensor([[0.3], [0.6]])  # per first axis, broadcast over the second: counts 2 and 4
    got = fresh(name).soft_topk(scores, fractions)
    for first, k in enumerate((2, 4)):
        torch.testing.assert_close(got[first], fresh(name).soft_topk(scores[first], k), rtol=0, atol=0)
    empty = torch.zeros(0, 7, dtype=torch.float64)
    assert fresh(name).soft_topk(empty, torch.zeros(0, dtype=torch.long)).shape == (0, 7)
    if configured(name).gives_permutation:
        assert fresh(name).permutation(empty, torch.zeros(0, dtype=torch.long)).shape == (0, 7, 0)


@pytest.mark.parametrize("name", ["lapsum", "neuralsort", "dftopk", "stk_threshold"])
def test_gradcheck_over_a_batched_axis_in_float64(name):
    operator = configured(name)
    scores = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda s: operator.soft_topk(s, 2, dim=1), (scores.requires_grad_(True),))


@pytest.mark.parametrize(
    "scores,k,dim,message",
    [
        (torch.tensor(1.0), 1, -1, r"LapSum takes scores of shape \(..., n\), got torch.Size\(\[\]\)"),
        (torch.zeros(2, 3), 1, 2, r"LapSum: dim=2 is not an axis of scores of shape \(2, 3\)"),
        (torch.zeros(2, 3), torch.tensor([1, 4]), -1, r"LapSum: k=4 exceeds the number of scores n=3"),
        (torch.zeros(2, 3), torch.tensor([1, 2, 3]), -1, r"LapSum: k of shape \(3,\) does not fit scores with rows"),
        (torch.zeros(2, 3), torch.tensor([0.5, 1.5]), -1, r"LapSum: k=\[0.5, 1.5\] as a floating tensor holds"),
        (torch.zeros(2, 3), torch.tensor([0, 1]), -1, r"LapSum: k=\[0, 1\] as an integer tensor holds per-row counts"),
        (torch.zeros(2, 3), 1.5, -1, r"LapSum: k=1.5 as a float is a fraction of the batch and must lie in \(0, 1\]"),
        (torch.zeros(2, 3), 4, -1, r"LapSum: k=4 must be an int in \[1, 3\]"),
    ],
)
def test_bad_shapes_dims_and_ks_are_one_line(scores, k, dim, message):
    from topklab.operators import LapSum

    with pytest.raises(ValueError, match=message) as raised:
        LapSum().soft_topk(scores, k, dim=dim)
    assert "\n" not in str(raised.value)


VIEWS = ("ViewBackward0", "UnsafeViewBackward0", "PermuteBackward0", "ReshapeAliasBackward0", "AliasBackward0")


@pytest.mark.parametrize("name", NAMES)
def test_batch_by_n_scores_along_the_last_axis_get_no_view_around_the_core(name):
    """(batch, n) scores reduced over their last axis reach the core and come back as they are: a view
    (movedim, reshape) would add an autograd node to every call, what the small-n peer table pays."""
    operator = configured(name)
    scores = torch.randn(3, 8, requires_grad=True)
    calls = [operator.soft_topk(scores, 3)] + ([operator.permutation(scores, 3)] if operator.gives_permutation else [])
    for out in calls:
        assert out.grad_fn is not None and out.grad_fn.name() not in VIEWS, out.grad_fn.name()
    moved = operator.soft_topk(scores.detach().T.requires_grad_(), 3, dim=0)  # another axis still works
    assert moved.shape == (8, 3)
