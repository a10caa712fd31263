"""Kept at tests/vision_files.py for src/topklab/bench/cifar_epoch.py (scripts/bench_cifar_epoch.py, which
puts tests/ on sys.path and imports ``vision_files.write_cifar100``); the writers live in
:mod:`helpers.vision_files`. Tests import them from there."""

from helpers.vision_files import write_cifar100, write_fashion_mnist, write_idx, write_tree

__all__ = ["write_cifar100", "write_fashion_mnist", "write_idx", "write_tree"]
