"""Petersen et al.'s CIFAR-100 rows as difftopk's scripts run them: the ResNet-18 with the max-pool after
its stem and fan-out initialisation, the last partial batch dropped, and a random (not per-class) 5 %
hold-out scored on augmented images."""

import numpy as np
import pytest
import torch

from topklab.data.vision.loaders import DeviceLoader
from topklab.data.vision.splits import holdout, random_holdout
from topklab.models import resnet18_cifar


def test_difftopks_resnet18_pools_after_the_stem_and_inits_fan_out():
    torch.manual_seed(0)
    pooled, plain = resnet18_cifar(100, stem_pool=True, init="torchvision"), resnet18_cifar(100)
    assert sum(p.numel() for p in pooled.parameters()) == sum(p.numel() for p in plain.parameters())  # a pool adds none
    sizes = {}
    for name, net in (("pooled", pooled), ("plain", plain)):
        stages = [m for m in net.layers]
        hooks = [
            stages[i].register_forward_hook(lambda m, i, o, k=(name, i): sizes.__setitem__(k, o.shape[-1]))
            for i in (0, 2, 4, 6)
        ]
        net(torch.zeros(2, 3, 32, 32))
        for hook in hooks:
            hook.remove()
    assert [sizes[("pooled", i)] for i in (0, 2, 4, 6)] == [16, 8, 4, 2]
    assert [sizes[("plain", i)] for i in (0, 2, 4, 6)] == [32, 16, 8, 4]
    conv = pooled.layers[6].conv2.weight  # 512 → 512, 3 × 3: fan-out Kaiming std = sqrt(2 / (512 · 9))
    assert conv.std().item() == pytest.approx((2 / (512 * 9)) ** 0.5, rel=0.02)
    bound = 1 / 512**0.5  # PyTorch's default Linear init: U(−1/√fan_in, 1/√fan_in)
    assert pooled.fc.weight.abs().max().item() <= bound and plain.fc.weight.abs().max().item() > bound
    with pytest.raises(ValueError, match="model.init='xavier'"):
        resnet18_cifar(10, init="xavier")


def test_the_random_holdout_is_not_per_class():
    labels = np.repeat(np.arange(100), 500)
    train, val = random_holdout(labels, 0.05, seed=0)
    assert len(val) == 2500 and len(train) == 47_500 and not set(train) & set(val)  # difftopk: N // 20
    per_class = np.bincount(labels[val], minlength=100)
    assert per_class.min() < 25 < per_class.max()  # a stratified draw would give 25 of every class
    assert np.bincount(labels[holdout(labels, 0.05, seed=0)[1]], minlength=100).tolist() == [25] * 100
    assert random_holdout(labels, 0.05, seed=1)[1].tolist() != val.tolist()


def test_an_augmented_validation_split_keeps_its_order_and_one_draw():
    images = torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8)
    plain = DeviceLoader(images, torch.arange(10), 4, [0.5] * 3, [0.5] * 3, train=False)
    augmented = DeviceLoader(images, torch.arange(10), 4, [0.5] * 3, [0.5] * 3, train=False, augment=True)
    first, again = list(augmented.batches()), list(augmented.batches())
    assert [y.tolist() for _, y in first] == [y.tolist() for _, y in plain.batches()]  # stored order
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))  # the same seeded draw every evaluation
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, plain.batches()))  # cropped and flipped


def test_the_rows_compose_to_difftopks_loader_and_model(compose_cfg):
    cfg = compose_cfg("experiment=petersen/cifar100/diffsortnets_uniform")
    assert (cfg.model.stem_pool, cfg.model.init, cfg.engine.drop_last) == (True, "torchvision", True)
    assert (cfg.dataset.validation, cfg.dataset.val_augment, cfg.dataset.val_fraction) == ("random_holdout", True, 0.05)


def test_cifar100_with_difftopks_hold_out_end_to_end(tmp_path):
    from helpers.vision_files import write_cifar100
    from topklab.data.vision import CIFAR100

    root = write_cifar100(tmp_path, per_class_train=20, per_class_test=1)
    data = CIFAR100(
        root=str(root), mean=[0.5] * 3, std=[0.25] * 3, validation="random_holdout", val_augment=True
    ).splits()
    assert data.sizes() == {"train": 1900, "val": 100, "test": 100} and data.info["validation"] == "random_holdout"
    val = torch.cat([x for x, _ in data.eval_loader("val", 64, "cpu").batches()])
    stored = (data.x_val.float() - 127.5) / 63.75
    assert val.shape == stored.shape and not torch.allclose(val, stored)  # augmented
    test = torch.cat([x for x, _ in data.eval_loader("test", 64, "cpu").batches()])
    assert torch.allclose(test, (data.x_test.float() - 127.5) / 63.75)  # the test split never is
    with pytest.raises(ValueError, match="val_augment works with the device and torchvision loaders"):
        CIFAR100(root=str(root), mean=[0.5] * 3, std=[0.25] * 3, loader="resized", resolution=32, val_augment=True)
