"""Every option of every config group composes and instantiates (lightning-hydra-template style)."""
import pytest
from hydra.utils import instantiate

from conftest import CONFIG_DIR
from topklab.cli import config_groups
from topklab.train.run import build

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
    build(cfg.model, "model", in_features=3)
    build(cfg.loss, "loss")
    build(cfg.individual, "individual")
    build(cfg.trainer, "trainer")
    build(cfg.logger, "logger")
    optimizer_factory = instantiate(cfg.optim)
    assert callable(optimizer_factory)
    assert dataset.task in ("binary", "regression")


def test_regression_datasets_default_to_square_loss_but_accept_overrides(compose_cfg):
    assert compose_cfg("dataset=housing").individual._target_ == "topklab.losses.Square"
    assert compose_cfg("dataset=housing", "individual=absolute").individual._target_ == "topklab.losses.Absolute"
    assert compose_cfg("dataset=german").individual._target_ == "topklab.losses.Logistic"
