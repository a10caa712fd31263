"""Classification losses and operators: logit adjustment, top-k cross-entropy against difftopk,
SinkhornSort, the smooth top-k SVM, the CIFAR ResNets, metrics and LR schedules."""

import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F

from topklab.engine.schedules import LRFactor
from topklab.losses import CostSensitiveCE, LogitAdjusted, SmoothTopKSVM, TopKCrossEntropy
from topklab.models import resnet18_cifar, resnet32
from topklab.operators import DiffSortNet, DifftopkNetwork, NeuralSort, SinkhornSort, SoftSort
from topklab.tasks.classification_metrics import classification_metrics, shot_groups

with contextlib.redirect_stdout(io.StringIO()):
    import difftopk


def test_logit_adjusted_is_ce_on_shifted_logits_and_ce_at_tau_zero():
    counts = [50, 30, 15, 5]
    logits, labels = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 3, 1])
    prior = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    expected = F.cross_entropy(logits + 1.5 * prior.log(), labels, reduction="none")
    assert torch.allclose(LogitAdjusted(counts, tau=1.5).double()(logits, labels), expected, atol=1e-6)
    assert torch.allclose(
        LogitAdjusted(counts, tau=0.0)(logits.float(), labels),
        F.cross_entropy(logits.float(), labels, reduction="none"),
    )
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: LogitAdjusted(counts).double()(z, labels), (logits,))
    with pytest.raises(ValueError, match="at least one"):
        LogitAdjusted([3, 0])


def test_cost_sensitive_ce_weights_each_sample_by_its_inverse_class_frequency():
    counts = [50, 30, 15, 5]
    logits, labels = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 3, 1])
    inverse = [1.0 / n for n in counts]
    weights = [w / (sum(inverse) / len(inverse)) for w in inverse]  # mean 1 over classes
    expected = torch.stack([weights[int(y)] * -torch.log_softmax(z, 0)[y] for z, y in zip(logits, labels)])
    loss = CostSensitiveCE(counts).double()
    assert torch.allclose(loss(logits, labels), expected, atol=1e-6)
    assert torch.allclose(
        CostSensitiveCE(counts, power=0.0)(logits.float(), labels),
        F.cross_entropy(logits.float(), labels, reduction="none"),
    )
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: loss(z, labels), (logits,))
    with pytest.raises(ValueError, match="at least one"):
        CostSensitiveCE([3, 0])
    with pytest.raises(ValueError, match="power"):
        CostSensitiveCE(counts, power=-1.0)


OPERATORS = {
    "neuralsort": lambda dist: NeuralSort(tau=0.5),
    "softsort": lambda dist: SoftSort(tau=0.5),
    "odd_even": lambda dist: DiffSortNet("odd_even", 2.0, dist, 0.5),
    "bitonic__non_sparse": lambda dist: DiffSortNet("bitonic", 2.0, dist, 0.5),
}
DENSE = [
    ("neuralsort", "cauchy"),
    ("softsort", "cauchy"),
    ("odd_even", "logistic_phi"),
    ("bitonic__non_sparse", "logistic"),
]


@pytest.mark.parametrize("method,distribution", DENSE)
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("m", [None, 8])
def test_topk_ce_batch_mean_equals_difftopk(method, distribution, top1_mode, m):
    torch.manual_seed(0)
    logits, labels = torch.randn(16, 12) * 2, torch.randint(0, 12, (16,))
    p_k = [0.25, 0, 0.25, 0, 0.5]
    ours = TopKCrossEntropy(p_k, OPERATORS[method](distribution), m, top1_mode, num_classes=12)(logits, labels)
    reference = difftopk.TopKCrossEntropyLoss(method, 2.0, p_k, 12, m, distribution, 0.5, "cpu", top1_mode)(
        logits, labels
    )
    assert ours.shape == (16,)
    assert ours.mean().item() == pytest.approx(reference.item(), rel=1e-5, abs=1e-5)  # float32 sums in another order


def slow_topk_probability(P_topk: torch.Tensor, label: int, k: int) -> torch.Tensor:
    """P(true class among the top k) from a (n, K) top-k permutation (column 0 = top-1), rank by rank."""
    return sum(P_topk[label, r] for r in range(k))


def test_topk_ce_sort_mode_matches_the_slow_formula_for_sinkhorn():
    torch.manual_seed(1)
    logits, labels = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 5, 2, 3])
    p_k = [0.2, 0.3, 0.5]
    loss = TopKCrossEntropy(p_k, SinkhornSort(5.0, 50), top1_mode="sort", num_classes=6)
    ascending = SinkhornSort(5.0, 50).sort(logits)
    for i in range(4):
        P = torch.stack([ascending[i, :, 5 - r] for r in range(3)], dim=1)  # top ranks, best first
        p = sum(p_k[k - 1] * slow_topk_probability(P, int(labels[i]), k) for k in (1, 2, 3))
        assert loss(logits, labels)[i].item() == pytest.approx(-math.log(p * (1 - 2e-7) + 1e-7), rel=1e-9)


def test_topk_ce_with_p_k_one_is_softmax_cross_entropy():
    logits, labels = torch.randn(5, 7), torch.randint(0, 7, (5,))
    loss = TopKCrossEntropy([1.0], NeuralSort(1.0), top1_mode="sm", num_classes=7)
    assert torch.allclose(loss(logits, labels), F.cross_entropy(logits, labels, reduction="none"), atol=1e-5)


@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("operator", [SinkhornSort(2.0, 20), DiffSortNet("odd_even", 2.0, "cauchy")])
def test_topk_ce_gradcheck_float64(top1_mode, operator):
    torch.manual_seed(2)
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 2, 4])
    loss = TopKCrossEntropy([0.5, 0.5], operator, num_classes=5, top1_mode=top1_mode)
    assert torch.autograd.gradcheck(lambda z: loss(z, labels), (logits,))


@pytest.mark.parametrize(
    "p_k,match",
    [
        ([0.5, 0.4], "sums to"),
        ([0.5, -0.5, 1.0], "non-negative"),
        ([0.1] * 10 + [0.0] * 3, "classes"),
    ],
)
def test_topk_ce_rejects_bad_p_k(p_k, match):
    with pytest.raises(ValueError, match=match):
        TopKCrossEntropy(p_k, NeuralSort(), num_classes=10)


def test_topk_ce_rejects_bad_settings_with_the_fix():
    with pytest.raises(ValueError, match="gives a top-k permutation"):
        TopKCrossEntropy([1.0], torch.nn.Identity(), num_classes=4)
    with pytest.raises(ValueError, match="K=2 < m < classes=4"):
        TopKCrossEntropy([0.5, 0.5], NeuralSort(), m=4, num_classes=4)
    with pytest.raises(ValueError, match="smaller is sharper"):
        NeuralSort(tau=0.0)


@pytest.mark.skipif(difftopk.functional.SPARSE_INSTALLED, reason="torch-sparse is installed")
@pytest.mark.parametrize("network", ["bitonic", "splitter_selection"])
def test_difftopk_sparse_networks_without_torch_sparse_say_how_to_get_it(network):
    with pytest.raises(ValueError, match="torch-sparse.*make sparse"):
        DifftopkNetwork(network, sparse=True)


def test_sinkhorn_sort_is_doubly_stochastic():
    torch.manual_seed(3)
    P = SinkhornSort(inverse_temperature=20.0, iterations=200, tol=0.0).sort(torch.randn(4, 9, dtype=torch.float64))
    assert (P >= 0).all()
    assert torch.allclose(P.sum(dim=1), torch.ones(4, 9, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(P.sum(dim=2), torch.ones(4, 9, dtype=torch.float64), atol=1e-6)


def test_sinkhorn_sort_tends_to_the_hard_sort_as_the_temperature_falls():
    generator = torch.Generator().manual_seed(4)
    scores = torch.stack([torch.randperm(7, generator=generator) for _ in range(6)]).double()
    hard = F.one_hot(scores.argsort(dim=1), 7).transpose(1, 2).double()  # hard[b, i, r] = 1 if item i at rank r
    errors = [(SinkhornSort(beta, 3000).sort(scores) - hard).abs().max().item() for beta in (10.0, 1e3, 1e5)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-3


def test_sinkhorn_sort_gradcheck():
    scores = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: SinkhornSort(3.0, 20).sort(s), (scores,))


@pytest.mark.parametrize("tau", [1.0, 0.05])
def test_smooth_topk_svm_batch_mean_equals_difftopk(tau):
    torch.manual_seed(5)
    logits, labels = torch.randn(12, 10) * 5, torch.randint(0, 10, (12,))
    ours = SmoothTopKSVM(k=5, tau=tau, num_classes=10)(logits, labels)
    reference = difftopk.SmoothHardTopKLoss(10, 5, tau)(logits, labels)
    assert ours.shape == (12,) and ours.mean().item() == pytest.approx(reference.item(), rel=1e-5)


def test_resnets_have_the_published_sizes_and_take_any_channels():
    assert sum(p.numel() for p in resnet32(100).parameters()) == 470_004  # ≈ 0.46 M (He et al.: 0.46 M)
    assert sum(p.numel() for p in resnet18_cifar(100).parameters()) == 11_220_132  # ≈ 11.2 M
    assert resnet32(10, in_channels=1)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_metrics_against_slow_loops():
    torch.manual_seed(6)
    logits, labels = torch.randn(40, 6), torch.randint(0, 6, (40,))
    counts = [300, 150, 60, 25, 10, 3]
    result = classification_metrics(logits, labels, counts, topk=(1, 5))
    order = logits.argsort(dim=1, descending=True)
    assert result["top1"] == pytest.approx(100 * sum(int(order[i, 0] == labels[i]) for i in range(40)) / 40)
    assert result["top5"] == pytest.approx(100 * sum(int(labels[i] in order[i, :5]) for i in range(40)) / 40)
    per_class = []
    for c in range(6):
        idx = [i for i in range(40) if labels[i] == c]
        per_class.append(100 * sum(int(order[i, 0] == c) for i in idx) / len(idx) if idx else None)
    assert result["per_class"] == pytest.approx(per_class)
    groups = shot_groups(counts)
    assert groups == {"many": [0, 1], "medium": [2, 3], "few": [4, 5]}
    for name, classes in groups.items():
        values = [per_class[c] for c in classes if per_class[c] is not None]
        assert result[name] == pytest.approx(sum(values) / len(values))


@pytest.mark.parametrize("name", ["cosine", "step", "constant"])
def test_lr_factor_against_the_formula(name):
    factor = LRFactor(
        name, steps_per_epoch=4, epochs=10, warmup_epochs=2, milestones=[5, 8], gamma=0.5, min_lr_ratio=0.1
    )
    for step in range(40):
        if step < 8:
            expected = (step + 1) / 8
        elif name == "cosine":
            expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 8) / 32))
        elif name == "step":
            expected = 0.5 ** ((step >= 20) + (step >= 32))
        else:
            expected = 1.0
        assert factor(step) == pytest.approx(expected)
    with pytest.raises(ValueError, match="choose one of"):
        LRFactor("linear", 4, 10)


def test_expected_calibration_error_matches_a_slow_loop():
    from topklab.tasks.classification_metrics import expected_calibration_error

    torch.manual_seed(0)
    logits, labels = torch.randn(300, 7) * 3, torch.randint(0, 7, (300,))
    probabilities = torch.softmax(logits.double(), dim=1)
    total = 0.0
    for b in range(10):  # bin b holds confidences in (b/10, (b+1)/10]; the first also holds 0
        low, high = b / 10, (b + 1) / 10
        members = [
            i for i in range(300) if low < probabilities[i].max() <= high or (b == 0 and probabilities[i].max() == 0)
        ]
        if members:
            accuracy = sum(int(probabilities[i].argmax() == labels[i]) for i in members) / len(members)
            confidence = sum(float(probabilities[i].max()) for i in members) / len(members)
            total += len(members) / 300 * abs(accuracy - confidence)
    assert expected_calibration_error(logits, labels) == pytest.approx(total * 100, rel=1e-9)
    assert expected_calibration_error(torch.tensor([[50.0, 0.0]] * 4), torch.zeros(4, dtype=torch.long)) < 1e-9
