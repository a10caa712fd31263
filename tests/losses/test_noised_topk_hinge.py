"""Garcin et al.'s noised top-K hinge losses: per-sample values whose batch mean (and its gradient)
equals the authors' pytopk given the same draws, seeding, the noised k-th largest, one-line errors."""

import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONFIG_DIR
from topklab.engine.build import build_for_data
from topklab.losses.individual.noised_topk_hinge import ImbalancedNoisedTopKHinge, NoisedTopKHinge, noised_kth_largest

pytopk = pytest.importorskip("pytopk")
from pytopk.functional import bal_noised_topk_loss, imbal_noised_topk_loss  # noqa: E402
from pytopk.noised_topk import _noised_topk  # noqa: E402

COUNTS = [50, 30, 20, 10, 8, 6, 5, 4, 3, 2]


def batch(dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(32, 10, generator=generator, dtype=dtype)
    scores[:4] *= 0.01  # some samples with near-tied scores: active hinge, noisy ranks
    labels = torch.randint(0, 10, (32,), generator=generator)
    noise = torch.randn(32, 10, 5, generator=generator, dtype=dtype)
    return scores, labels, noise


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("k,epsilon", [(1, 1.0), (5, 1.0), (3, 0.01)])
def test_balanced_mean_and_gradient_equal_pytopk(dtype, k, epsilon):
    scores, labels, noise = batch(dtype)
    ours_in = scores.clone().requires_grad_()
    theirs_in = scores.clone().requires_grad_()
    per_sample = NoisedTopKHinge(k=k, epsilon=epsilon, num_samples=5, num_classes=10)(ours_in, labels, noise=noise)
    assert per_sample.shape == (32,) and (per_sample >= 0).all()
    reference = bal_noised_topk_loss(theirs_in, labels, k, epsilon, _noised_topk, noise)
    torch.testing.assert_close(per_sample.mean(), reference, rtol=0, atol=1e-6)
    per_sample.mean().backward()
    reference.backward()
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [50.0, 1.0])
def test_imbalanced_mean_and_gradient_equal_pytopk(dtype, scale):
    scores, labels, noise = batch(dtype, seed=1)
    scores = scores / 10  # cosine-like scores, where the margins matter at scale 50
    reference_module = pytopk.ImbalNoisedTopK(k=3, epsilon=0.01, max_m=0.3, cls_num_list=COUNTS, scale=scale)
    loss = ImbalancedNoisedTopKHinge(k=3, epsilon=0.01, num_samples=5, max_m=0.3, scale=scale, class_counts=COUNTS)
    torch.testing.assert_close(loss.margins, reference_module.m_list, rtol=0, atol=0)
    ours_in, theirs_in = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    per_sample = loss(ours_in, labels, noise=noise)
    assert per_sample.shape == (32,) and (per_sample > 0).any() and (per_sample >= 0).all()
    reference = imbal_noised_topk_loss(theirs_in, labels, 3, reference_module.m_list, 0.01, _noised_topk, noise, scale)
    torch.testing.assert_close(per_sample.mean(), reference.to(dtype), rtol=0, atol=1e-6 * scale)
    per_sample.mean().backward()
    reference.backward()
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=0, atol=1e-6 * scale)


def test_modules_draw_like_pytopk_from_the_global_generator():
    """Unseeded, our draws are torch.randn(batch, classes, samples) like pytopk's, so the same global
    seed gives the same batch loss as pytopk's modules (float32, their default dtype)."""
    scores, labels, _ = batch(torch.float32)
    torch.manual_seed(5)
    reference = pytopk.BalNoisedTopK(k=2, epsilon=1.0)(scores, labels)
    torch.manual_seed(5)
    ours = NoisedTopKHinge(k=2, epsilon=1.0, num_classes=10)(scores, labels).mean()
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    torch.manual_seed(6)
    reference = pytopk.ImbalNoisedTopK(k=2, epsilon=0.01, max_m=0.3, cls_num_list=COUNTS)(scores / 10, labels)
    torch.manual_seed(6)
    ours = ImbalancedNoisedTopKHinge(k=2, class_counts=COUNTS)(scores / 10, labels).mean()
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


def test_noised_kth_largest():
    scores = torch.tensor([[3.0, -1.0, 2.0, 0.5], [0.0, 1.0, 2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    zero = torch.zeros(2, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(noised_kth_largest(scores, 2, 1.0, zero), torch.tensor([2.0, 2.0], dtype=torch.float64))
    noise = torch.randn(2, 4, 3, dtype=torch.float64)
    value = noised_kth_largest(scores, 3, 0.5, noise)
    expected = (scores.detach()[..., None] + 0.5 * noise).sort(dim=1, descending=True).values[:, 2, :].mean(-1)
    torch.testing.assert_close(value, expected)
    (grad,) = torch.autograd.grad(value.sum(), scores)  # the mean one-hot of the 3rd largest: rows sum to 1
    torch.testing.assert_close(grad.sum(1), torch.ones(2, dtype=torch.float64))
    assert set(grad.flatten().tolist()) <= {0.0, 1 / 3, 2 / 3, 1.0}


def test_seeds():
    scores, labels, _ = batch()
    make = lambda seed: NoisedTopKHinge(k=2, epsilon=1.0, num_classes=10, seed=seed)  # noqa: E731
    assert torch.equal(make(3)(scores, labels), make(3)(scores, labels))
    assert not torch.equal(make(3)(scores, labels), make(4)(scores, labels))
    loss = make(3)
    assert not torch.equal(loss(scores, labels), loss(scores, labels))  # seeded once: the stream moves on


def test_configs_build_with_the_data_context():
    context = {"num_classes": 10, "class_counts": COUNTS, "in_features": 3}
    balanced = build_for_data(
        OmegaConf.load(CONFIG_DIR / "individual" / "noised_topk_hinge.yaml"), "individual", context
    )
    imbalanced = build_for_data(
        OmegaConf.load(CONFIG_DIR / "individual" / "noised_topk_hinge_imbalanced.yaml"), "individual", context
    )
    assert (balanced.k, balanced.epsilon, balanced.num_classes) == (5, 1.0, 10)
    assert (imbalanced.k, imbalanced.epsilon, imbalanced.max_m, imbalanced.scale) == (5, 0.01, 0.3, 50.0)
    scores, labels, _ = batch(torch.float32)
    assert balanced(scores, labels).shape == imbalanced(scores, labels).shape == (32,)


@pytest.mark.parametrize(
    "cls,kwargs,message",
    [
        (
            NoisedTopKHinge,
            {"k": 10, "num_classes": 10},
            r"k=10 must be an int in \[1, 9\] \(fewer than the 10 classes\)",
        ),
        (NoisedTopKHinge, {"k": 0, "num_classes": 10}, r"k=0 must be an int in \[1, 9\]"),
        (NoisedTopKHinge, {"epsilon": 0.0, "num_classes": 10}, r"epsilon=0.0 must be a number > 0"),
        (NoisedTopKHinge, {"num_samples": 0, "num_classes": 10}, r"num_samples=0 must be an int >= 1"),
        (NoisedTopKHinge, {"seed": 1.5, "num_classes": 10}, r"seed=1.5 must be an int or null"),
        (NoisedTopKHinge, {}, r"NoisedTopKHinge needs num_classes"),
        (ImbalancedNoisedTopKHinge, {}, r"ImbalancedNoisedTopKHinge needs class_counts"),
        (ImbalancedNoisedTopKHinge, {"class_counts": [3, 0, 2]}, r"every class needs at least one training example"),
        (
            ImbalancedNoisedTopKHinge,
            {"class_counts": COUNTS, "num_classes": 5},
            r"class_counts has 10 entries but num_classes=5",
        ),
        (ImbalancedNoisedTopKHinge, {"class_counts": COUNTS, "max_m": -0.3}, r"max_m=-0.3 must be a number > 0"),
        (ImbalancedNoisedTopKHinge, {"class_counts": COUNTS, "scale": 0}, r"scale=0 must be a number > 0"),
    ],
)
def test_bad_settings_are_one_line_errors(cls, kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        cls(**kwargs)
    assert "\n" not in str(error.value)


def test_bad_input_is_a_one_line_error():
    loss = NoisedTopKHinge(k=2, num_classes=10)
    for output, noise, message in (
        (torch.zeros(4, 9), None, r"scores of shape \(batch, 10\), got \(4, 9\)"),
        (torch.zeros(4, 10), torch.zeros(4, 10), r"noise must have shape"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            loss(output, torch.zeros(4, dtype=torch.long), noise=noise)
        assert "\n" not in str(error.value)
