"""Petersen et al.'s ImageNet tables (2 and 3, 1K and 21K-P parts; Table 5's DiffSortNet entries):
every row composes to difftopk's recipe and smoke-runs offline on tiny embeddings in the real layout;
the engine's per-metric selection on the hold-out is difftopk's."""

import json

import pytest

from helpers import ROOT, filed_table
from helpers.embedding_files import write_embeddings
from topklab.config import config_groups
from topklab.engine.run import train

ROWS = [
    r
    for r in config_groups(ROOT / "configs")["experiment"]
    if r.startswith(("petersen/imagenet1k/", "petersen/imagenet21kp/", "petersen/table5/"))
]
METHODS = ("bitonic", "splitter_selection", "neuralsort", "softsort", "sinkhorn")
P_K = {
    "top5": [0, 0, 0, 0, 1],
    "pk_50_50": [0.5, 0, 0, 0, 0.5],
    "pk_25_75": [0.25, 0, 0, 0, 0.75],
    "pk_10_90": [0.1, 0, 0, 0, 0.9],
    "uniform": [0.2] * 5,
}


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory):
    return write_embeddings(
        tmp_path_factory.mktemp("embeddings"), classes=60, dim=16, sizes={"train": 260, "test": 120}
    )


def test_every_cell_of_the_grid_has_a_row():
    grid = {"softmax_ce", "topm_softmax", "smooth_topk_svm_top5", *(f"{m}_{p}" for m in METHODS for p in P_K)}
    for dataset in ("imagenet1k", "imagenet21kp"):
        assert {r.split("/")[-1] for r in ROWS if r.startswith(f"petersen/{dataset}/")} == grid
    assert {r for r in ROWS if r.startswith("petersen/table5/")} == {
        "petersen/table5/l2_bitonic",
        "petersen/table5/l2_splitter_selection",
        "petersen/table5/l2_softmax_ce",
    }


@pytest.mark.parametrize(
    "dataset,lr,epochs,m,holdout", [("imagenet1k", 10**-4.5, 20, 16, 50_000), ("imagenet21kp", 1e-4, 40, 50, 100_000)]
)
def test_rows_compose_to_difftopks_recipe(compose_cfg, dataset, lr, epochs, m, holdout):
    for method in METHODS:
        for name, p_k in P_K.items():
            cfg = compose_cfg(f"experiment=petersen/{dataset}/{method}_{name}")
            assert (cfg.optim._target_, cfg.optim.lr, cfg.engine.epochs, cfg.engine.batch_size) == (
                "torch.optim.Adam",
                pytest.approx(lr),
                epochs,
                500,
            )
            assert (cfg.individual.m, cfg.individual.top1_mode, list(cfg.individual.p_k)) == (m, "sm", p_k)
            assert (
                cfg.dataset.holdout == holdout and cfg.loss._target_.endswith("Average") and cfg.model.hidden_dims == []
            )
            assert (
                list(cfg.engine.select_metrics) == ["top1", "top5"]
                and cfg.engine.eval_every_steps == 100
                and cfg.engine.drop_last
            )
            assert (cfg.result.family, cfg.result.table, cfg.result.get("row")) == (
                "vision",
                f"petersen_{dataset}",
                None,
            )
            operator = cfg.individual.operator
            if method in ("bitonic", "splitter_selection"):
                assert (operator.network, operator.steepness, operator.distribution, operator.art_lambda) == (
                    method,
                    1.0,
                    "logistic_phi",
                    0.5,
                )
            elif method in ("neuralsort", "softsort"):
                assert operator.tau == 2.0  # difftopk's --inverse_temperature 0.5
    assert compose_cfg(f"experiment=petersen/{dataset}/softmax_ce").individual._target_.endswith("CrossEntropy")
    topm = compose_cfg(f"experiment=petersen/{dataset}/topm_softmax").individual
    assert (list(topm.p_k), topm.m, topm.top1_mode) == ([1, 0, 0, 0, 0], m, "sm")
    svm = compose_cfg(f"experiment=petersen/{dataset}/smooth_topk_svm_top5").individual
    assert (svm.k, svm.tau) == (5, 1.0)


def test_table5_rows(compose_cfg):
    import yaml

    aliases = yaml.safe_load((ROOT / "results" / "paper" / "petersen_icml2022.yaml").read_text())["table5"]["aliases"]
    assert aliases == {f"wsl_{n}": f"petersen_imagenet1k/{n}_uniform" for n in ("bitonic", "splitter_selection")}
    for network in ("bitonic", "splitter_selection"):
        l2 = compose_cfg(f"experiment=petersen/table5/l2_{network}")
        assert l2.dataset.name == "imagenet1k_l2_800" and list(l2.individual.p_k) == [0.25, 0, 0, 0, 0.75]
        assert (l2.individual.operator.distribution, l2.individual.operator.steepness, l2.individual.m) == (
            "logistic",
            0.5,
            16,
        )


@pytest.mark.parametrize("row", ROWS)
def test_row_smoke_runs_offline_on_tiny_embeddings(compose_cfg, tmp_path, row, embeddings):
    table, name = f"petersen_{row.split('/')[1]}", row.split("/")[-1]
    result_file = tmp_path / table / name / "seed0.json"
    cfg = compose_cfg(
        f"experiment={row}",
        f"dataset.root={embeddings}",
        "dataset.holdout=60",
        "engine.batch_size=50",
        "engine.eval_batch_size=60",
        "engine.eval_every_steps=2",
        "engine.max_steps=3",
        "engine.epochs=1",
        "engine.checkpoint=false",
        "engine.progress=false",
        "logger=none",
        f"result_file={result_file}",
    )
    summary = train(cfg, tmp_path / "run")
    result = json.loads(result_file.read_text())["result"]
    assert (result["table"], result["row"], result["label"]) == (filed_table(table, summary), name, cfg.row)
    assert summary["steps"] == 3 and set(summary["selection"]) == {"top1", "top5"}
    assert summary["data"]["sizes"] == {"train": 200, "val": 60, "test": 120}


def test_each_metric_keeps_its_own_best_hold_out_state(compose_cfg, tmp_path, embeddings):
    """difftopk reports the test value at the evaluation with the best validation value, per metric,
    ties keeping the earlier (its strict >): the engine's selection, checked against the record."""
    cfg = compose_cfg(
        "experiment=petersen/imagenet1k/softmax_ce",
        f"dataset.root={embeddings}",
        "dataset.holdout=60",
        "engine.batch_size=20",
        "engine.eval_batch_size=60",
        "engine.eval_every_steps=1",
        "engine.epochs=2",
        "engine.checkpoint=false",
        "engine.progress=false",
        "logger=csv",
        "optim.lr=0.03",
        "result_file=null",
    )
    summary = train(cfg, tmp_path / "run")
    import csv

    evaluations = list(csv.DictReader(open(tmp_path / "run" / "log.csv")))
    for metric in ("top1", "top5"):
        values = [float(e[f"val_{metric}"]) for e in evaluations]
        first_best = values.index(max(values))
        assert summary["selection"][metric]["step"] == int(evaluations[first_best]["step"])
        assert summary["selection"][metric]["val"] == pytest.approx(max(values))


def test_the_tables_name_every_row_still_missing_until_it_has_a_result(tmp_path):
    import yaml

    from helpers.tables import fake_vision_run
    from topklab.report.schema import read_results
    from topklab.report.vision import render_vision

    papers = [yaml.safe_load((ROOT / "results" / "paper" / "petersen_icml2022.yaml").read_text())]
    pending = render_vision([], papers)
    text = pending["petersen_imagenet1k.md"]
    assert "**Still missing:** every row (28: softmax_ce, topm_softmax, smooth_topk_svm_top5, bitonic_top5," in text
    assert "make reproduce-petersen-imagenet1k" in text and "88.37" in pending["petersen_table5.md"]
    fake_vision_run(
        tmp_path, "petersen_imagenet1k", "softmax_ce", "Softmax CE, P_K = [1,0,0,0,0]", 0, 80.0, 95.0, [80.0, 0, 0]
    )
    text = render_vision(read_results(tmp_path / "vision", "vision"), papers)["petersen_imagenet1k.md"]
    assert "| Softmax CE, P_K = [1,0,0,0,0] | 1 | 80.00 ± 0.00 | 96.00 ± 0.00 |" in text
    missing = next(line for line in text.splitlines() if line.startswith("**Still missing:**"))
    assert "softmax_ce," not in missing and "topm_softmax, smooth_topk_svm_top5, bitonic_top5" in missing


def test_m_outside_k_and_the_classes_is_one_line(compose_cfg, tmp_path):
    from topklab.utils.errors import TopklabError

    few = write_embeddings(tmp_path / "few", classes=12, dim=8, sizes={"train": 100, "test": 20})
    cfg = compose_cfg(
        "experiment=petersen/imagenet1k/bitonic_uniform",
        f"dataset.root={few}",
        "dataset.holdout=20",
        "logger=none",
        "result_file=null",
    )
    with pytest.raises(TopklabError, match=r"individual: m=16 must satisfy K=5 < m < classes=12") as err:
        train(cfg, tmp_path / "run")
    assert "\n" not in str(err.value) and not (tmp_path / "run" / "summary.json").exists()


def test_p_k_top1_with_top_m_is_a_softmax_over_the_pre_selected_classes_not_softmax_ce():
    import torch
    import torch.nn.functional as F

    from topklab.losses import TopKCrossEntropy
    from topklab.operators import DiffSortNet

    torch.manual_seed(0)
    logits, labels = torch.randn(6, 40, dtype=torch.float64), torch.randint(0, 40, (6,))
    loss = TopKCrossEntropy(
        [1, 0, 0, 0, 0], DiffSortNet("bitonic", steepness=1.0), m=16, top1_mode="sm", num_classes=40
    )(logits, labels)
    for i in range(6):  # the slow, obvious reference: the true class and the 15 highest others, then softmax CE
        others = torch.cat([logits[i, : labels[i]], logits[i, labels[i] + 1 :]]).topk(15).values
        kept = torch.cat([logits[i, labels[i]].view(1), others])
        expected = -torch.log(torch.softmax(kept, 0)[0] * (1 - 2e-7) + 1e-7)
        assert loss[i].item() == pytest.approx(expected.item(), rel=1e-9)
    assert not torch.allclose(loss, F.cross_entropy(logits, labels, reduction="none"))


def test_table5_shows_the_imagenet1k_runs_as_its_wsl_rows(tmp_path):
    import yaml

    from helpers.tables import fake_vision_run
    from topklab.report.schema import read_results
    from topklab.report.vision import render_vision

    papers = [yaml.safe_load((ROOT / "results" / "paper" / "petersen_icml2022.yaml").read_text())]
    fake_vision_run(
        tmp_path, "petersen_imagenet1k", "bitonic_uniform", "Top-k DiffSortNets (bitonic)", 0, 86.0, 98.0, [86.0, 0, 0]
    )
    text = render_vision(read_results(tmp_path / "vision", "vision"), papers)["petersen_table5.md"]
    assert "| Top-k DiffSortNets (bitonic) | 1 | 86.00 ± 0.00 | 99.00 ± 0.00 |" in text
    missing = next(line for line in text.splitlines() if line.startswith("**Still missing:**"))
    assert "wsl_bitonic" not in missing and "wsl_splitter_selection" in missing and "l2_bitonic" in missing
