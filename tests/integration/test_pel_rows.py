"""STk Tables 5, 7 and 8 (vision): every row composes to the paper's recipe and smoke-runs a step
offline (a tiny ViT, a fake image tree in the OLTR layout, fake CIFAR-100 files); gradient
accumulation reproduces the whole batch's Average and STk objective; the last state is reported
when a row asks for it."""

import json

import pytest

from helpers import ROOT
from helpers.vision_runs import TINY_VIT, data_overrides
from topklab.config import config_groups
from topklab.engine.result_guard import row_filing
from topklab.engine.run import train
from topklab.utils.errors import TopklabError

ROWS = [
    r
    for r in config_groups(ROOT / "configs")["experiment"]
    if r.startswith(("stk/table5/", "stk/table7/", "stk/table8/"))
]


def test_every_vision_cell_of_tables_5_7_8_has_a_row():
    columns = ("cifar100lt", "imagenet_lt", "places_lt")
    assert {r for r in ROWS if r.startswith("stk/table5/")} == {
        f"stk/table5/{c}_{a}" for c in columns for a in ("average", "atk", "stk")
    }
    assert {r for r in ROWS if r.startswith("stk/table8/")} == {
        f"stk/table8/{c}_delta_{d}" for c in columns for d in ("0_1", "0_05", "0_005")
    }
    assert {r for r in ROWS if r.startswith("stk/table7/")} == {
        f"stk/table7/{c}_{r}"
        for c in ("cifar100lt", "imagenet_lt")
        for r in ("mae", "mae_cs", "mae_cs_stk", "clip_pel", "clip_pel_stk")
    }


def test_the_rows_compose_to_the_papers_recipes(compose_cfg):
    pel = compose_cfg("experiment=stk/table5/places_lt_stk")
    assert (pel.optim.lr, pel.optim.momentum, pel.optim.weight_decay, pel.engine.batch_size, pel.engine.epochs) == (
        0.01,
        0.9,
        5e-4,
        128,
        10,
    )
    assert pel.engine.schedule.per_epoch and pel.engine.schedule.warmup_epochs == 0 and pel.engine.amp == "fp16"
    assert (
        pel.engine.report_state == "last"
        and pel.individual._target_.endswith("LogitAdjusted")
        and pel.individual.tau == 1.0
    )
    assert (pel.loss.k, pel.loss.delta, pel.dataset.tte, pel.model.scale) == (0.9, 0.01, "fivecrop", 25.0)
    assert pel.model.backbone.endswith("clip_quickgelu_224.openai") and pel.tuner._target_.endswith("AdaptFormer")
    cifar = compose_cfg("experiment=stk/table5/cifar100lt_average")
    assert cifar.model.backbone == "vit_base_patch16_224.augreg_in21k_ft_in1k" and list(cifar.dataset.mean) == [0.5] * 3
    assert (
        cifar.dataset.validation == "balanced_unused"
        and cifar.dataset.tte == "none"
        and cifar.dataset.resolution == 224
    )
    mae = compose_cfg("experiment=stk/table7/imagenet_lt_mae_cs_stk")
    assert (mae.engine.batch_size, mae.engine.micro_batch_size, mae.engine.max_steps) == (2048, 128, 30000)
    assert mae.engine.epochs * 57 >= 30000 and mae.individual._target_.endswith("CostSensitiveCE") and mae.loss.k == 0.9
    assert compose_cfg("experiment=stk/table8/imagenet_lt_delta_0_005").loss.delta == 0.005
    assert row_filing(compose_cfg("experiment=stk/table7/cifar100lt_clip_pel_stk").result, None) == {
        **row_filing(cifar.result, None),
        "row": "stk",
    }  # Table 7's CLIP + PEL STk row is Table 5's run: the same file


def test_table7_clip_pel_rows_are_table5_runs(compose_cfg):
    for dataset in ("cifar100lt", "imagenet_lt"):
        for row, source in (("clip_pel", "average"), ("clip_pel_stk", "stk")):
            assert compose_cfg(f"experiment=stk/table7/{dataset}_{row}") == compose_cfg(
                f"experiment=stk/table5/{dataset}_{source}"
            )


@pytest.mark.parametrize("row", [r for r in ROWS if "clip_pel" not in r])  # the clip_pel rows are Table 5's (above)
def test_row_smoke_runs_a_step_offline(compose_cfg, tmp_path, row, cifar_root, listed_tree):
    cfg = compose_cfg(
        f"experiment={row}",
        *data_overrides(row, cifar_root, listed_tree),
        *TINY_VIT,
        *(["model.head_init=null"] if "clip" in row or "imagenet_lt_" in row or "places_lt_" in row else []),
        "engine.epochs=1",
        "engine.max_steps=1",
        "engine.batch_size=8",
        "engine.micro_batch_size=4",
        "engine.eval_batch_size=8",
        "engine.amp=none",
        "engine.progress=false",
        "logger=none",
        f"result_file={tmp_path}/result.json",
    )
    summary = train(cfg, tmp_path / "run")
    result = json.loads((tmp_path / "result.json").read_text())["result"]
    assert summary["steps"] == 1 and result["label"] == cfg.row and summary["best_step"] == 1
    assert 0 < summary["parameters"]["trainable"] <= summary["parameters"]["total"]


def accumulation_run(compose_cfg, tmp_path, cifar_root, *overrides):
    """A tiny ViT (LayerNorm only: no batch statistics) on fake CIFAR-100, 3 steps of 16 images."""
    cfg = compose_cfg(
        "dataset=cifar100",
        f"dataset.root={cifar_root}",
        "dataset.val_fraction=0.34",
        "model=peft_vit_in21k_b16",
        *TINY_VIT,
        "model.head_init=null",
        "optim.lr=0.05",
        "engine.epochs=1",
        "engine.max_steps=3",
        "engine.batch_size=16",
        "engine.progress=false",
        "logger=none",
        "result_file=null",
        f"paths.log_dir={tmp_path}",
        *overrides,
    )
    return train(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    "loss,update,exact",
    [("average", [], True), ("stk", ["loss.lam_update=gradient"], True), ("stk", [], False), ("atk", [], False)],
)
def test_micro_batches_give_the_whole_batch_objective_for_average_and_gradient_stk(
    compose_cfg, tmp_path, cifar_root, loss, update, exact
):
    """A shared trainable λ makes STk separable over micro-batches; a solved λ is each chunk's own root,
    so (like ATk's top-k) the objective is the chunks'."""
    k = ["loss.k=0.75"] if loss != "average" else []  # 12 of 16 and 3 of each 4: whole counts
    whole = accumulation_run(compose_cfg, tmp_path / "whole", cifar_root, f"loss={loss}", *k, *update)
    chunked = accumulation_run(
        compose_cfg, tmp_path / "chunked", cifar_root, f"loss={loss}", *k, *update, "engine.micro_batch_size=4"
    )
    losses = [s["history"][0]["train_loss"] for s in (whole, chunked)]
    if exact:
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
        if loss == "stk":
            assert chunked["lambda"] == pytest.approx(whole["lambda"], rel=1e-4, abs=1e-6)
    else:  # ATk's top-k and a solved λ are taken within each chunk
        assert losses[1] != pytest.approx(losses[0], rel=1e-3)


def test_report_state_last_reports_the_final_epoch(compose_cfg, tmp_path, cifar_root):
    summary = accumulation_run(
        compose_cfg,
        tmp_path,
        cifar_root,
        "engine.max_steps=null",
        "engine.epochs=3",
        "engine.report_state=last",
        "optim.lr=0.5",
    )
    history = summary["history"]
    assert summary["best_epoch"] == 3 and summary["metrics"]["val"]["top1"] == pytest.approx(history[-1]["val_top1"])
    with pytest.raises(TopklabError, match="report_state"):
        accumulation_run(compose_cfg, tmp_path / "bad", cifar_root, "engine.report_state=first")


def test_micro_batch_size_is_checked():
    from topklab.engine import Engine

    with pytest.raises(ValueError, match="micro_batch_size"):
        Engine(micro_batch_size=0)
    assert [(s.start, s.stop) for s in Engine(micro_batch_size=4)._chunks(10)] == [(0, 4), (4, 8), (8, 10)]


def test_a_pel_result_renders_beside_the_papers_values_and_names_the_missing_rows(compose_cfg, tmp_path, listed_tree):
    import yaml

    from topklab.report.schema import read_results
    from topklab.report.vision import render_vision

    row = "stk/table8/places_lt_delta_0_05"
    result_file = tmp_path / "results" / "vision" / "pel_places_lt" / "delta_0_05" / "seed0.json"
    cfg = compose_cfg(
        f"experiment={row}",
        *data_overrides(row, None, listed_tree),
        *TINY_VIT,
        "model.head_init=null",
        "engine.epochs=1",
        "engine.max_steps=1",
        "engine.batch_size=8",
        "engine.amp=none",
        "engine.device=cpu",  # a run on a GPU is filed in its own table, pel_places_lt_cuda
        "engine.progress=false",
        "logger=none",
        f"result_file={result_file}",
    )
    train(cfg, tmp_path / "run")
    papers = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "results" / "paper").glob("*.yaml"))]
    text = render_vision(read_results(tmp_path / "results" / "vision", "vision"), papers)["pel_places_lt.md"]
    assert "**Still missing:** average, atk, stk, delta_0_1, delta_0_005" in text
    assert (
        "| LA + STk (δ = 0.05) | 1 |" in text and "| 53.80 |" in text and "the last epoch (as PEL/LIFT report)" in text
    )
