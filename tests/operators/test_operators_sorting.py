"""The sorting operators (DiffSortNet, NeuralSort, SoftSort, SinkhornSort, difftopk's networks) under
the one operator API: float64 gradchecks, a slow obvious reference, the hard limit, and agreement
with difftopk 0.2.0 / diffsort 0.2.0 (P_topk to 1e-5)."""

import contextlib
import io
import math

import pytest
import torch

from topklab.operators import (
    DiffSortNet,
    DifftopkNetwork,
    NeuralSort,
    SinkhornSort,
    SoftSort,
    hard_permutation,
    hard_topk,
)
from topklab.operators.networks import NETWORKS, bitonic_layers, odd_even_layers, splitter_selection_layers
from topklab.operators.relaxations import RELAXATIONS

with contextlib.redirect_stdout(io.StringIO()):
    import diffsort
    import difftopk
    from difftopk import functional as difftopk_functional
    from difftopk import networks as difftopk_networks


def swap_alpha(d: torch.Tensor, distribution: str, beta: float, lam: float) -> torch.Tensor:
    """α of one soft comparator with d = b − a, as papers.md §2.3 writes each distribution."""
    v = beta * d
    if distribution == "logistic":
        return torch.sigmoid(v)
    if distribution == "logistic_phi":
        return torch.sigmoid(v / (d.abs() + 1e-10) ** lam)
    if distribution == "gaussian":
        return 0.5 + 0.5 * torch.erf(v / math.sqrt(2.0))
    if distribution == "reciprocal":
        return 0.5 * (v / (2 + v.abs()) + 1)
    if distribution == "cauchy":
        return torch.atan(v) / math.pi + 0.5
    tail = 0.0 if v.abs() <= 0.25 else torch.sign(v) * (0.25 - 1 / (16 * v.abs()))
    return torch.clamp(v, -0.25, 0.25) + 0.5 + tail


def slow_network_permutation(scores: torch.Tensor, layers, k: int, distribution: str, beta: float, lam: float):
    """One row at a time: each layer as an explicit n×n mixing matrix (min/max of each soft swap),
    the permutation as the product of the transposed matrices applied to the k top output wires."""
    rows = []
    for x in scores:
        n = len(x)
        matrices = []
        for layer in layers:
            mix = torch.eye(n, dtype=x.dtype)
            new = x.clone()
            for low, high in layer:  # min leaves on `low`, max on `high`
                alpha = swap_alpha(x[high] - x[low], distribution, beta, lam)  # ≈ 1 when in order
                mix[low, low], mix[low, high] = alpha, 1 - alpha
                mix[high, low], mix[high, high] = 1 - alpha, alpha
                new[low] = alpha * x[low] + (1 - alpha) * x[high]
                new[high] = (1 - alpha) * x[low] + alpha * x[high]
            matrices.append(mix)
            x = new
        total = torch.eye(n, dtype=x.dtype)
        for mix in matrices:
            total = mix @ total  # output wires = total @ input wires
        rows.append(torch.stack([total[n - 1 - j] for j in range(k)], dim=1))
    return torch.stack(rows)


def diffsort_pairs(matrices):
    """(min wire, max wire) comparators of diffsort/difftopk layer matrices (identity slots dropped)."""
    layers = []
    for split_a, split_b, combine_min, combine_max, *_ in matrices:
        layer = []
        for c in range(split_a.shape[0]):
            a, b = int(split_a[c].argmax()), int(split_b[c].argmax())
            if a != b:
                layer.append((int(combine_min[:, c].argmax()), int(combine_max[:, c].argmax())))
        layers.append(sorted(layer))
    return layers


@pytest.mark.parametrize("n", [2, 5, 8, 13, 16])
def test_network_layouts_are_diffsort_and_difftopk_ones(n):
    assert [sorted(layer) for layer in odd_even_layers(n)] == diffsort_pairs(diffsort.networks.odd_even_network(n))
    assert [sorted(layer) for layer in bitonic_layers(n)] == diffsort_pairs(diffsort.networks.bitonic_network(n))
    with contextlib.redirect_stdout(io.StringIO()):
        for k in range(1, n + 1):
            expected = diffsort_pairs(difftopk_networks.sparse_splitter_selection_network(n, k))
            assert [sorted(layer) for layer in splitter_selection_layers(n, k)] == expected


@pytest.mark.parametrize("network", list(NETWORKS))
@pytest.mark.parametrize("distribution", list(RELAXATIONS))
def test_diffsortnet_matches_the_slow_reference_in_float64(network, distribution):
    torch.manual_seed(0)
    scores = torch.randn(3, 9, dtype=torch.float64) * 2
    k = 4
    expected = slow_network_permutation(scores, NETWORKS[network](9, k), k, distribution, 1.5, 0.5)
    ours = DiffSortNet(network, 1.5, distribution, 0.5).permutation(scores, k)
    assert torch.allclose(ours, expected, atol=1e-12)


@pytest.mark.parametrize(
    "network,n,k",
    [("odd_even", 7, 3), ("odd_even", 6, 6), ("bitonic", 8, 2), ("bitonic", 6, 3), ("splitter_selection", 7, 2)],
)
@pytest.mark.parametrize("distribution", list(RELAXATIONS))
def test_diffsortnet_gradcheck_float64(network, n, k, distribution):
    torch.manual_seed(1)
    scores = (torch.randn(2, n, dtype=torch.float64) * 2).requires_grad_(True)
    operator = DiffSortNet(network, 1.3, distribution, 0.5)
    assert torch.autograd.gradcheck(lambda s: operator.permutation(s, k), (scores,))


@pytest.mark.parametrize(
    "network,n,k", [("odd_even", 100, 5), ("odd_even", 11, 11), ("bitonic", 100, 5), ("bitonic", 32, 7)]
)
@pytest.mark.parametrize("distribution", list(RELAXATIONS))
def test_diffsortnet_gives_difftopks_p_topk_and_gradient(network, n, k, distribution):
    torch.manual_seed(2)
    scores = (torch.randn(16, n) * 3).requires_grad_(True)
    reference_net = difftopk.DiffTopkNet(network, n, k, steepness=0.7, art_lambda=0.5, distribution=distribution)
    reference = reference_net(scores)[1].flip(-1)
    ours = DiffSortNet(network, 0.7, distribution, 0.5).permutation(scores, k)
    # float32 round-off, summed in another order over up to n layers: both are as far from the
    # float64 result (checked against the slow reference above) as from each other
    assert (ours - reference).abs().max() < 2e-5
    weights = torch.randn(16, n, k)
    grad_ours = torch.autograd.grad((ours * weights).sum(), scores)[0]
    grad_reference = torch.autograd.grad((reference * weights).sum(), scores)[0]
    assert (grad_ours - grad_reference).abs().max() <= 2e-3 * grad_reference.abs().max()


@pytest.mark.parametrize("n,k", [(100, 5), (33, 7), (10, 1), (8, 8)])
def test_splitter_selection_gives_difftopks_p_topk(n, k):
    # difftopk runs this network only through torch-sparse; its dense executor gives the same product
    with contextlib.redirect_stdout(io.StringIO()):
        matrices = difftopk_networks.sparse_splitter_selection_network(n, k)
    dense = [[torch.from_numpy(m).float() for m in layer[:4]] for layer in matrices]
    torch.manual_seed(3)
    scores = torch.randn(8, n) * 3
    reference = difftopk_functional.execute_topk(dense, scores, k, 0.5, 0.5, "logistic_phi")[1].flip(-1)
    ours = DiffSortNet("splitter_selection", 0.5, "logistic_phi", 0.5).permutation(scores, k)
    assert (ours - reference).abs().max() < 1e-5


@pytest.mark.parametrize("network", list(NETWORKS))
def test_diffsortnet_is_the_hard_top_k_at_high_steepness(network):
    scores = torch.randperm(40, generator=torch.Generator().manual_seed(4)).double().reshape(2, 20)
    P = DiffSortNet(network, 1e3, "logistic").permutation(scores, 6)
    assert torch.allclose(P, hard_permutation(scores, 6), atol=1e-9)
    assert torch.allclose(DiffSortNet(network, 1e3, "logistic").soft_topk(scores, 6), hard_topk(scores, 6), atol=1e-9)


@pytest.mark.parametrize("network", list(NETWORKS))
def test_diffsortnet_on_one_item_selects_it(network):
    scores = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    P = DiffSortNet(network).permutation(scores, 1)
    assert torch.equal(P, torch.ones(3, 1, 1, dtype=torch.float64))


def test_diffsortnet_columns_are_distributions_over_items():
    P = DiffSortNet("bitonic", 0.5, "cauchy").permutation(torch.randn(4, 12, dtype=torch.float64), 5)
    assert (P >= 0).all() and torch.allclose(P.sum(1), torch.ones(4, 5, dtype=torch.float64))
    assert (P.sum(2) <= 1 + 1e-12).all()


def test_diffsortnet_half_precision_runs_in_float32_and_returns_the_input_dtype():
    scores = torch.randn(4, 10)
    half = DiffSortNet("odd_even", 2.0, "logistic").permutation(scores.half(), 3)
    assert half.dtype == torch.float16
    assert torch.allclose(
        half.float(), DiffSortNet("odd_even", 2.0, "logistic").permutation(scores.half().float(), 3), atol=1e-3
    )


@pytest.mark.parametrize("tau", [0.5, 4.0])
def test_neuralsort_and_softsort_give_difftopks_top_columns(tau):
    torch.manual_seed(5)
    scores = torch.randn(6, 10) * 2
    neural = difftopk.NeuralSort(tau=tau)(scores)  # sorts −scores: ascending ranks
    assert torch.allclose(NeuralSort(tau).permutation(scores, 4), neural[:, :, -4:].flip(-1), atol=1e-6)
    soft = difftopk.SoftSort(tau=tau)(-scores).transpose(-2, -1)
    assert torch.allclose(SoftSort(tau).permutation(scores, 4), soft[:, :, -4:].flip(-1), atol=1e-6)


@pytest.mark.parametrize("operator", [NeuralSort(0.7), SoftSort(0.7), SinkhornSort(3.0, 30)])
def test_sort_operators_gradcheck_and_sum_to_k(operator):
    torch.manual_seed(6)
    scores = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: operator.permutation(s, 3), (scores,))
    assert torch.allclose(operator.soft_topk(scores, 3).sum(1), torch.full((2,), 3.0, dtype=torch.float64))


@pytest.mark.parametrize("operator", [NeuralSort(1e-3), SoftSort(1e-3), SinkhornSort(1e5, 3000)])
def test_sort_operators_are_the_hard_top_k_at_low_temperature(operator):
    scores = torch.randperm(12, generator=torch.Generator().manual_seed(7)).double().reshape(2, 6)
    assert torch.allclose(operator.permutation(scores, 3), hard_permutation(scores, 3), atol=1e-3)


def test_difftopk_network_operator_is_difftopks_output_in_our_column_order():
    scores = torch.randn(3, 9)
    ours = DifftopkNetwork("odd_even", steepness=2.0, distribution="cauchy").permutation(scores, 3)
    expected = difftopk.DiffTopkNet("odd_even", 9, 3, steepness=2.0, distribution="cauchy")(scores)[1]
    assert torch.equal(ours, expected.flip(-1))
    assert torch.allclose(ours, DiffSortNet("odd_even", 2.0, "cauchy").permutation(scores, 3), atol=1e-6)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: DiffSortNet("quicksort"), "choose one of"),
        (lambda: DiffSortNet("odd_even", steepness=0.0), "larger is sharper"),
        (lambda: DiffSortNet("odd_even", distribution="uniform"), "choose one of"),
        (lambda: DiffSortNet("odd_even", art_lambda=-1.0), ">= 0"),
        (lambda: DiffSortNet().permutation(torch.zeros(2, 3), 4), r"k=4 must be an int in \[1, 3\]"),
        (lambda: DiffSortNet().permutation(torch.tensor(1.0), 1), r"shape \(..., n\)"),
        (lambda: DifftopkNetwork("splitter_selection"), "sparse=true"),
        (lambda: SoftSort(tau=-1.0), "smaller is sharper"),
    ],
)
def test_bad_operator_input_is_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sinkhorn_sort_stops_on_its_tolerance_and_says_when_the_budget_ends_unconverged():
    import warnings

    from topklab.operators import SinkhornSort
    from topklab.utils.errors import TopklabError

    scores = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    early = SinkhornSort(inverse_temperature=1.0, iterations=500, tol=1e-4)
    plan = early.sort(scores)
    assert early.last_error <= 1e-4 and float((plan.sum(2) - 1).abs().max()) <= 1e-4 + 1e-6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sharp = SinkhornSort(inverse_temperature=1e5, iterations=300)
        sharp.sort(scores)
        sharp.sort(scores)
    assert sharp.last_error > 0.5 and sum("did not converge" in str(w.message) for w in caught) == 1
    with pytest.raises(TopklabError, match="did not converge: after 300 iterations"):
        SinkhornSort(inverse_temperature=1e5, iterations=300, unconverged="raise").sort(scores)
    with pytest.raises(ValueError, match="unconverged"):
        SinkhornSort(unconverged="maybe")


def test_only_the_unbounded_operators_give_entries_above_one():
    """NeuralSort and SoftSort say ``bounded = False``: near-equal scores give an entry above 1."""
    from topklab.operators import DFTopK, LapSum, SoftTopKOT

    close = torch.tensor([[0.0, 0.01, 0.02, 0.03, 1.0, -1.0]])
    assert float(NeuralSort(0.01).soft_topk(close, 4).max()) > 1.0 and not NeuralSort.bounded and not SoftSort.bounded
    for operator in (
        DFTopK(0.01),
        LapSum(0.01),
        SoftTopKOT(0.01),
        SinkhornSort(100.0, 1000),
    ):  # Sinkhorn: up to its tol
        assert operator.bounded and float(operator.soft_topk(close, 4).max()) <= 1.0 + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("operator", [NeuralSort(0.3), NeuralSort(5.0), SoftSort(0.3), SoftSort(2.0, power=2.0)])
def test_the_all_finite_core_is_the_masked_core_bit_for_bit(operator, dtype):
    """NeuralSort's and SoftSort's cores on all-finite rows (rest None) leave out masks that are
    identities there: the values and the gradients equal the masked path's (rest = plain(...)) exactly."""
    from topklab.operators.base import plain

    torch.manual_seed(9)
    scores = (torch.randn(4, 12, dtype=dtype) * 3).requires_grad_()
    weights = torch.randn(4, 12, 5, dtype=dtype)
    fast = operator._permutation(scores, 5, None)
    masked = operator._permutation(scores, 5, plain(scores, 5))
    assert torch.equal(fast, masked)
    (fast_grad,) = torch.autograd.grad((fast * weights).sum(), scores)
    (masked_grad,) = torch.autograd.grad((masked * weights).sum(), scores)
    assert torch.equal(fast_grad, masked_grad)
