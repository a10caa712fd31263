"""Every option of every config group composes and instantiates (lightning-hydra-template style)."""
import pytest
from hydra.utils import instantiate

from conftest import CONFIG_DIR
from topklab.cli import config_groups
from topklab.train.run import build, build_for_data

FAKE_DATA = {"in_features": 3, "in_channels": 3, "num_classes": 10, "class_counts": [50, 30, 20, 10, 8, 6, 5, 4, 3, 2]}

GROUP_OPTIONS = [(group, option) for group, options in config_groups(CONFIG_DIR).items() for option in options]


def test_there_is_something_to_compose():
    groups = dict(config_groups(CONFIG_DIR))
    for group in ("dataset", "model", "loss", "individual", "optim", "trainer", "logger"):
        assert groups.get(group), f"config group {group} is empty"


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_compose_and_instantiate(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}")
    assert cfg[group] is not None
    dataset = build(cfg.dataset, "dataset")
    build_for_data(cfg.model, "model", FAKE_DATA)
    build(cfg.loss, "loss")
    build_for_data(cfg.individual, "individual", FAKE_DATA)
    build(cfg.trainer, "trainer")
    build(cfg.logger, "logger")
    optimizer_factory = instantiate(cfg.optim)
    assert callable(optimizer_factory)
    assert dataset.task in ("binary", "regression", "multiclass")


def test_regression_datasets_default_to_square_loss_but_accept_overrides(compose_cfg):
    assert compose_cfg("dataset=housing").individual._target_ == "topklab.losses.Square"
    assert compose_cfg("dataset=housing", "individual=absolute").individual._target_ == "topklab.losses.Absolute"
    assert compose_cfg("dataset=german").individual._target_ == "topklab.losses.Logistic"


@pytest.mark.parametrize("dataset,model,trainer", [
    ("cifar100", "resnet18_cifar", "ClassificationTrainer"), ("cifar100lt", "resnet32", "ClassificationTrainer"),
    ("fmnistlt", "resnet32", "ClassificationTrainer"), ("australian", "MLP", "TabularTrainer"),
])
def test_image_datasets_switch_model_trainer_and_loss_but_accept_overrides(compose_cfg, dataset, model, trainer):
    cfg = compose_cfg(f"dataset={dataset}")
    assert cfg.model._target_.endswith(model) and cfg.trainer._target_.endswith(trainer)
    assert compose_cfg(f"dataset={dataset}", "model=resnet18_cifar").model._target_.endswith("resnet18_cifar")


def test_loss_topk_ce_is_the_mean_of_the_top_k_cross_entropy(compose_cfg):
    cfg = compose_cfg("dataset=cifar100", "loss=topk_ce")
    assert cfg.loss._target_ == "topklab.losses.Average"
    assert cfg.individual._target_ == "topklab.losses.TopKCrossEntropy"
    for field in ("top1_mode", "distribution", "inverse_temperature", "art_lambda", "m", "p_k", "method"):
        assert field in cfg.individual
    assert compose_cfg("dataset=fmnistlt", "loss=stk").individual._target_ == "topklab.losses.LogitAdjusted"
