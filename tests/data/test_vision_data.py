"""Image data: on-disk readers, the long-tailed profile and draw, validation splits, and the two
loaders (the device fast path against torchvision's DataLoader path)."""

import gzip
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.vision_files import write_cifar100, write_fashion_mnist, write_idx
from topklab.data.vision import CIFAR100, DeviceLoader, FashionMNIST, TorchvisionLoader
from topklab.data.vision.files import find_fashion_mnist, read_idx
from topklab.data.vision.longtail import exponential_profile, longtail_indices
from topklab.data.vision.splits import balanced_from_unused, holdout
from topklab.utils.errors import DataUnavailableError, TopklabError

MEAN3, STD3 = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]


def test_cifar100_lt_profile_matches_the_reference_construction():
    counts = exponential_profile(500, 100, 100)
    assert sum(counts) == 10847 and counts[0] == 500 and counts[-1] == 5
    slow = [int(500 * (0.01 ** (c / 99.0))) for c in range(100)]
    assert counts == slow
    assert exponential_profile(500, 100, 1) == [500] * 100
    with pytest.raises(ValueError, match="imbalance_ratio"):
        exponential_profile(500, 10, 0.5)
    with pytest.raises(ValueError, match="without images"):
        exponential_profile(40, 10, 100)


def test_longtail_draw_takes_the_profile_per_class_and_depends_only_on_its_seed():
    labels = np.repeat(np.arange(5), 20)[np.random.RandomState(3).permutation(100)]
    counts = [20, 10, 5, 3, 2]
    chosen = longtail_indices(labels, counts, seed=7)
    assert np.bincount(labels[chosen], minlength=5).tolist() == counts
    assert len(set(chosen.tolist())) == len(chosen)
    assert np.array_equal(chosen, longtail_indices(labels, counts, seed=7))
    assert not np.array_equal(chosen, longtail_indices(labels, counts, seed=8))
    with pytest.raises(ValueError, match="fewer"):
        longtail_indices(labels, [21, 1, 1, 1, 1], seed=0)


def test_holdout_is_stratified_and_keeps_every_class():
    labels = np.array([0] * 100 + [1] * 3 + [2] * 1)
    train, val = holdout(labels, 0.05, seed=0)
    assert np.bincount(labels[val], minlength=3).tolist() == [5, 0, 0]
    assert np.bincount(labels[train], minlength=3).tolist() == [95, 3, 1]
    assert not set(train) & set(val) and len(train) + len(val) == len(labels)
    balanced = np.repeat(np.arange(100), 500)
    assert len(holdout(balanced, 0.05, seed=0)[1]) == 2500  # difftopk's 5 % of CIFAR-100


def test_balanced_validation_comes_from_unused_images_then_the_subset():
    labels = np.repeat(np.arange(3), 10)
    used = np.array([0, 1, 2, 10, 20])
    val, moved = balanced_from_unused(labels, used, per_class=4, num_classes=3, seed=0)
    assert np.bincount(labels[val]).tolist() == [4, 4, 4] and not set(val) & set(used) and len(moved) == 0
    used = np.concatenate([np.arange(10), [10, 20]])  # class 0 uses all its images
    val, moved = balanced_from_unused(labels, used, per_class=4, num_classes=3, seed=0)
    assert np.bincount(labels[val], minlength=3).tolist() == [4, 4, 4]
    assert set(moved) == set(val[labels[val] == 0]) and set(moved) <= set(range(10))
    with pytest.raises(ValueError, match="keeping one for training"):
        balanced_from_unused(np.array([0, 0, 1, 1, 2]), np.arange(5), per_class=1, num_classes=3, seed=0)


def test_cifar100lt_balanced_validation_keeps_the_tail_and_tops_up_class_0(tmp_path):
    root = write_cifar100(tmp_path, per_class_train=12, per_class_test=1)
    data = CIFAR100(
        root=str(root),
        mean=[0.5] * 3,
        std=[0.25] * 3,
        imbalance_ratio=2,
        n_max=12,
        validation="balanced_unused",
        val_per_class=1,
    ).splits()
    profile = data.info["profile"]
    assert data.sizes()["val"] == 100 and torch.bincount(data.y_val, minlength=100).tolist() == [1] * 100
    assert data.info["val_from_subset"][0] == 1 and sum(data.info["val_from_subset"]) == 1  # only class 0 is full
    assert data.class_counts == [profile[0] - 1] + profile[1:] and data.shot_counts == profile


def test_idx_reader_round_trip_and_corrupt_files(tmp_path):
    images = np.random.RandomState(0).randint(0, 256, size=(5, 28, 28)).astype(np.uint8)
    write_idx(tmp_path / "x.gz", images)
    assert np.array_equal(read_idx(tmp_path / "x.gz", 3), images)
    with gzip.open(tmp_path / "bad.gz", "wb") as handle:
        handle.write((1234).to_bytes(4, "big") + b"\0" * 12)
    with pytest.raises(TopklabError, match="magic number"):
        read_idx(tmp_path / "bad.gz", 3)
    raw = gzip.decompress((tmp_path / "x.gz").read_bytes())
    (tmp_path / "short.gz").write_bytes(gzip.compress(raw[:-10]))
    with pytest.raises(TopklabError, match="truncated"):
        read_idx(tmp_path / "short.gz", 3)
    (tmp_path / "notgz.gz").write_bytes(b"plain bytes")
    with pytest.raises(TopklabError, match="corrupt"):
        read_idx(tmp_path / "notgz.gz", 3)


def test_fashion_mnist_lt_splits(tmp_path):
    root = write_fashion_mnist(tmp_path / "fm", per_class_train=50, per_class_test=4)
    data = FashionMNIST(
        str(root),
        [0.286],
        [0.353],
        imbalance_ratio=10,
        n_max=40,
        validation="balanced_unused",
        val_per_class=5,
        split_seed=1,
    )
    splits = data.splits()
    assert splits.name == "fmnistlt" and splits.class_counts == exponential_profile(40, 10, 10)
    assert splits.x_train.dtype == torch.uint8 and tuple(splits.x_train.shape[1:]) == (1, 28, 28)
    assert torch.bincount(splits.y_val).tolist() == [5] * 10 and len(splits.y_test) == 40
    assert not set(splits.indices["val"]) & set(splits.indices["longtail"])
    assert {k: splits.provides()[k] for k in ("in_channels", "num_classes")} == {"in_channels": 1, "num_classes": 10}


def test_missing_data_says_where_to_put_it(tmp_path):
    with pytest.raises(DataUnavailableError, match="cifar-100-python.tar.gz"):
        CIFAR100(str(tmp_path), MEAN3, STD3).splits()
    with pytest.raises(DataUnavailableError, match="dataset-fashion-mnist"):
        find_fashion_mnist([tmp_path / "nothing"])


def test_cifar100_reader_and_lt_holdout(tmp_path):
    root = write_cifar100(tmp_path, per_class_train=6, per_class_test=1)
    data = CIFAR100(str(root), MEAN3, STD3, imbalance_ratio=3, n_max=6, val_fraction=0.2, lt_seed=0)
    splits = data.splits()
    assert splits.name == "cifar100lt" and tuple(splits.x_train.shape[1:]) == (3, 32, 32)
    assert min(splits.class_counts) >= 1 and len(splits.y_test) == 100
    assert sum(splits.class_counts) + len(splits.y_val) == sum(exponential_profile(6, 100, 3))
    assert splits.shot_counts == exponential_profile(6, 100, 3)  # groups by the set before hold-out
    (root / "cifar-100-python" / "train").write_bytes(b"not a pickle")
    with pytest.raises(TopklabError, match="not a readable cifar-100-python"):
        data.splits()
    with open(root / "cifar-100-python" / "train", "wb") as handle:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"fine_labels": [0, 1]}, handle)
    with pytest.raises(TopklabError, match="not CIFAR"):
        data.splits()


def crops_of(image: torch.Tensor, pad: int) -> list[torch.Tensor]:
    """Every padded crop of ``image`` and its mirror (the slow reference)."""
    padded = F.pad(image, (pad,) * 4)
    h, w = image.shape[-2:]
    crops = [padded[..., i : i + h, j : j + w] for i in range(2 * pad + 1) for j in range(2 * pad + 1)]
    return crops + [c.flip(-1) for c in crops]


@pytest.mark.parametrize("loader_cls", [DeviceLoader, TorchvisionLoader])
def test_augmented_batches_are_crops_and_flips_of_their_images(loader_cls):
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (12, 3, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.arange(12)
    loader = loader_cls(images, labels, 5, [0.0] * 3, [1 / 255] * 3, train=True, pad=2, seed=3)
    seen = []
    for x, y in loader.batches(epoch=1):
        for image, label in zip(x, y):
            assert any(torch.allclose(image, crop.float(), atol=1e-4) for crop in crops_of(images[label], 2))
            seen.append(int(label))
    assert sorted(seen) == list(range(12))


@pytest.mark.parametrize("loader_cls", [DeviceLoader, TorchvisionLoader])
def test_epochs_replay_exactly_and_resume_mid_epoch(loader_cls):
    images = torch.randint(0, 256, (20, 1, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    loader = loader_cls(images, torch.arange(20), 6, [0.5], [0.5], train=True, pad=1, seed=9)
    first = [(x.clone(), y.clone()) for x, y in loader.batches(epoch=4)]
    again = list(loader.batches(epoch=4))
    tail = list(loader.batches(epoch=4, start=2))
    other = list(loader.batches(epoch=5))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert len(tail) == 2 and all(torch.equal(a[0], b[0]) for a, b in zip(first[2:], tail))
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(first, other))


def test_both_loaders_give_identical_evaluation_batches():
    images = torch.randint(0, 256, (7, 3, 5, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    fast = list(DeviceLoader(images, torch.arange(7), 4, MEAN3, STD3, train=False).batches())
    slow = list(TorchvisionLoader(images, torch.arange(7), 4, MEAN3, STD3, train=False).batches())
    for (xa, ya), (xb, yb) in zip(fast, slow):
        assert torch.equal(ya, yb) and torch.allclose(xa, xb, atol=1e-6)
    expected = (images[:4].float() / 255 - 0.5) / 0.25
    assert torch.allclose(fast[0][0], expected, atol=1e-6)


def test_cifar_at_vit_resolution_goes_through_the_listed_pipeline(tmp_path):
    root = write_cifar100(tmp_path, per_class_train=3, per_class_test=1)
    common = dict(
        root=str(root),
        mean=[0.5] * 3,
        std=[0.5] * 3,
        validation="holdout",
        val_fraction=0.34,
        loader="resized",
        resolution=16,
        num_workers=0,
    )
    data = CIFAR100(**common).splits()
    assert data.info["resolution"] == 16 and data.info["interpolation"] == "bilinear"
    train = data.train_loader(8, False, seed=0, device="cpu")
    first = [x for x, _ in train.batches(epoch=0)]
    assert first[0].shape == (8, 3, 16, 16) and float(first[0].abs().max()) <= 1.0
    assert torch.equal(torch.cat(first), torch.cat([x for x, _ in train.batches(epoch=0)]))  # an epoch replays
    assert not torch.equal(first[0], next(iter(train.batches(epoch=1)))[0])
    resumed = next(iter(train.batches(epoch=0, start=1)))[0]
    assert torch.equal(resumed, first[1])
    x, y = next(iter(data.eval_loader("test", 4, "cpu").batches()))
    assert x.shape == (4, 3, 16, 16) and torch.equal(y, data.y_test[:4])
    plain, _ = next(iter(data.feature_loader(4, "cpu").batches()))
    expected = (F.interpolate(data.x_train[:4].float() / 255, size=16, mode="bilinear", antialias=True) - 0.5) / 0.5
    assert plain.shape == (4, 3, 16, 16) and torch.allclose(
        plain, expected, atol=0.02
    )  # PIL's antialiased resize of 32 to 16
    tte = CIFAR100(**{**common, "tte": "fivecrop"}).splits()
    assert next(iter(tte.eval_loader("test", 2, "cpu").batches()))[0].shape == (2, 5, 3, 16, 16)
    with pytest.raises(ValueError, match="resolution"):
        CIFAR100(**{**common, "resolution": None})
