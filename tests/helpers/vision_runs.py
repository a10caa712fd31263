"""Tiny vision runs shared by several test modules: the Fashion-MNIST-LT overrides and data
(``integration/test_vision_engine.py``, ``engine/test_run_identity.py``, ``integration/test_faults.py``), and the
PEL rows' tiny ViT, CIFAR-100 files and OLTR tree (``integration/test_pel_rows.py``, ``integration/test_cuda.py``).
The fixtures (module-scoped: one tree per test module) reach every folder through the root conftest's
``pytest_plugins``; the constants and ``data_overrides`` are imported."""

import pytest

from helpers.vision_files import write_cifar100, write_fashion_mnist, write_tree

TINY_FMNIST = [
    "dataset=fmnistlt",
    "dataset.n_max=40",
    "dataset.imbalance_ratio=10",
    "dataset.val_per_class=5",
    "engine.batch_size=16",
    "engine.eval_batch_size=64",
    "engine.progress=false",
    "logger=none",
]


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory):
    return write_fashion_mnist(tmp_path_factory.mktemp("fmnist"), per_class_train=50, per_class_test=6)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    return write_cifar100(tmp_path_factory.mktemp("cifar"), per_class_train=3, per_class_test=1)


TINY_VIT = ["model.backbone=vit_tiny_patch16_224", "model.pretrained=false", "model.img_size=32"]


@pytest.fixture(scope="module")
def listed_tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("listed"))


def data_overrides(row, cifar_root, listed_tree):
    if "cifar100lt" in row:
        return [
            f"dataset.root={cifar_root}",
            "dataset.n_max=3",
            "dataset.imbalance_ratio=1.5",
            "dataset.val_per_class=1",
            "dataset.resolution=32",
            "dataset.num_workers=0",
        ]
    images, lists = listed_tree
    return [
        f"dataset.root={images}",
        f"dataset.split_dir={lists}",
        "dataset.num_classes=3",
        "dataset.lists={train: Tiny_train.txt, val: Tiny_val.txt, test: Tiny_test.txt}",
        "dataset.resolution=32",
        "dataset.num_workers=0",
        "dataset.tte_expand=8",
    ]
