"""docs/contracts.md's Data contract: the toy dataset the page shows, taken from the page itself, trains
through train.py's path; a dataset missing a field of the contract is refused in one line naming it
and the page, before any training."""

import math
import re
import sys

import pytest
from omegaconf import open_dict

from helpers import ROOT
from topklab.engine import Engine
from topklab.engine.run import train
from topklab.utils.errors import TopklabError

PAGE = ROOT / "docs" / "contracts.md"


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    """The page's ```python example written to a module of its own, importable as ``toy_data``."""
    (example,) = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    (tmp_path / "toy_data.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("toy_data", None)


def toy_cfg(compose_cfg, target):
    """The regression recipe (an MLP and the square loss, as the page's yaml chooses) on ``target``."""
    cfg = compose_cfg("dataset=sinc", "engine.epochs=2", "engine.batch_size=8", "logger=none")
    with open_dict(cfg):
        cfg.dataset = {"_target_": target}
    return cfg


def test_the_pages_toy_dataset_trains(toy_module, compose_cfg, tmp_path):
    summary = train(toy_cfg(compose_cfg, "toy_data.Toy"), tmp_path / "run")
    assert summary["dataset"] == "toy" and summary["steps"] == 8
    assert math.isfinite(summary["metrics"]["test"]["rmse"])


@pytest.mark.parametrize("field", ["name", "info", "train_loader"])
def test_a_missing_field_is_one_line_naming_it_and_the_page_before_training(
    toy_module, compose_cfg, tmp_path, monkeypatch, field
):
    import toy_data

    class Lacking(toy_data.ToySplits):
        pass

    setattr(Lacking, field, None)
    monkeypatch.setattr(toy_data.Toy, "splits", lambda self: Lacking(self.x, self.y))
    monkeypatch.setattr(Engine, "fit", lambda *args, **kwargs: pytest.fail("the run trained"))
    with pytest.raises(TopklabError) as refused:
        train(toy_cfg(compose_cfg, "toy_data.Toy"), tmp_path / "run")
    message = str(refused.value)
    assert "\n" not in message and f"`{field}`" in message and "docs/contracts.md" in message
    assert not (tmp_path / "run").exists()
