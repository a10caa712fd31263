"""scripts/make_tables.py (topklab.report) on small fake results trees, and on the committed one."""

import json
import shutil
import sys

import numpy as np
import pytest
import yaml
from scipy.stats import wilcoxon

from helpers import ROOT
from helpers.tables import fake_vision_run
from topklab.report import make_result, write_result
from topklab.report.cli import render_tables
from topklab.report.tabular import paired_p_value
from topklab.utils.errors import TopklabError

sys.path.insert(0, str(ROOT / "scripts"))
import make_tables  # noqa: E402

GRID = {"k": [1, 0.5], "C": [100.0, 10.0], "lr": [0.01, 0.1], "delta": [0.001, 0.1]}


def fake_cell(
    results,
    table,
    dataset,
    individual,
    aggregate,
    test,
    selected,
    searched=("C", "lr", "k", "delta"),
    ties=None,
    seconds=10.0,
):
    combos = {axis: values if axis in searched else values[:1] * 2 for axis, values in GRID.items()}
    mean = float(np.mean(test))
    payload = {
        "cell": {"table": table, "dataset": dataset, "individual": individual, "aggregate": aggregate},
        "metric": "error_pct",
        "test_mean": mean,
        "test_std": float(np.std(test)),
        "per_split": {"test": list(test)},
        "selected": {"index": 0, **selected},
        "combos": combos,
        "ties": ties
        or {
            "rule": "first in grid order",
            "count": 1,
            "indices": [0],
            "test_min": mean,
            "test_max": mean,
            "test_mean": mean,
        },
        "preset": "fake",
        "seconds": seconds,
    }
    path = results / "tabular" / "fake" / table / dataset / f"{individual}-{aggregate}.json"
    write_result(
        path,
        make_result(
            "tabular",
            f"{table}/{dataset}/{individual}/{aggregate}",
            payload,
            "python scripts/reproduce_tabular.py preset=fake",
            {},
            {"git": {"sha": "abc1234"}},
        ),
        indent=None,
    )


@pytest.fixture
def results(tmp_path):
    (tmp_path / "paper").mkdir()
    shutil.copy(ROOT / "results" / "paper" / "stk_neurips2024.yaml", tmp_path / "paper")
    hyper = {"k": 0.5, "C": 100.0, "lr": 0.01, "delta": 0.001}
    stk = [13.0, 13.5, 12.0, 14.0, 13.2, 12.8]
    fake_cell(tmp_path, "table3", "australian", "logistic", "stk", stk, hyper, seconds=7200.0)
    fake_cell(
        tmp_path,
        "table3",
        "australian",
        "logistic",
        "atk",
        [16.0, 17.5, 15.0, 14.5, 16.5, 17.0],
        hyper,
        searched=("C", "lr", "k"),
    )
    fake_cell(
        tmp_path,
        "table3",
        "australian",
        "logistic",
        "average",
        stk,
        hyper,
        searched=("C", "lr"),
        ties={
            "rule": "first in grid order",
            "count": 3,
            "indices": [0, 1, 3],
            "test_min": 12.5,
            "test_max": 15.25,
            "test_mean": 14.0,
        },
    )
    fake_cell(tmp_path, "table6", "sinc", "square", "stk", [0.15, 0.14, 0.16, 0.15, 0.14, 0.16], hyper)
    return tmp_path


def test_tables_show_paper_ours_difference_mark_and_paired_tests(results):
    assert make_tables.main(["--results", str(results), "--preset", "fake"]) == 0
    md = (results / "tables" / "table3_fake.md").read_text()  # a preset other than full: its own file
    stk = [13.0, 13.5, 12.0, 14.0, 13.2, 12.8]
    row = next(line for line in md.splitlines() if line.startswith("| australian | logistic | STk |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "13.358 ± 0.982"
    assert cells[4] == f"{np.mean(stk):.3f} ± {np.std(stk):.3f}"
    assert cells[5] == f"{np.std(stk, ddof=1):.3f}"  # the sample std beside the population std
    assert cells[6] == f"{np.mean(stk) - 13.358:.3f}" and cells[7] == "✓"
    assert cells[8] == "C=100, η=0.01, k=0.5, δ=0.001"
    atk = next(line for line in md.splitlines() if line.startswith("| australian | logistic | ATk |"))
    assert atk.split("|")[7].strip() == "1.655" and atk.split("|")[8].strip() == ""  # 16.083 vs 14.428 ± 1.056
    assert atk.split("|")[9].strip() == "C=100, η=0.01, k=0.5"  # only the axes the cell searched
    average = next(line for line in md.splitlines() if line.startswith("| australian | logistic | Average |"))
    assert average.split("|")[9].strip() == "C=100, η=0.01" and average.split("|")[10].strip() == "3 (12.500–15.250)"
    assert (
        atk.split("|")[10].strip() == "1"
        and "2 of 4 cells tied" not in md
        and "1 of 3 cells tied, the widest test range 2.75" in md
    )
    assert "a tie goes to the first combination in grid order" in md
    p = wilcoxon(stk, [16.0, 17.5, 15.0, 14.5, 16.5, 17.0]).pvalue
    test_row = next(line for line in md.splitlines() if line.startswith("| australian | logistic | ATk | 6 |"))
    assert test_row.split("|")[7].strip() == f"{p:.3g}" and test_row.split("|")[6].strip() == "6/0/0"
    same = next(line for line in md.splitlines() if line.startswith("| australian | logistic | Average | 6 |"))
    assert same.split("|")[5].strip() == "+0.000" and same.split("|")[7].strip() == "1"
    assert "Missing cells (32)" in md and "| german | logistic | STk | 25.561 ± 1.988 | — | — | — | — | — | — |" in md
    assert "preset=fake" in md and "abc1234" in md
    assert (
        "Time: 7,220 s of cell time over 3 cells (2.01 h; each cell's training wall clock, summed), the longest "
        "7,200 s (australian/logistic/stk)." in md
    )
    tex = (results / "tables" / "table6_fake.tex").read_text()
    assert r"sinc & square & STk & $0.1446 \pm 0.0070$ & $0.1500 \pm 0.0082$ & 0.0054 & \checkmark \\" in tex
    assert (results / "tables" / "table4_fake.md").exists() and not (results / "tables" / "table3.md").exists()


def test_the_full_preset_gives_the_papers_table_files_and_every_stored_preset_renders(results):
    full = results / "tabular" / "full"
    (results / "tabular" / "fake").rename(full)
    fake_cell(
        results, "table3", "german", "logistic", "stk", [25.0, 26.0], {"k": 0.5, "C": 100.0, "lr": 0.01, "delta": 0.001}
    )
    assert make_tables.main(["--results", str(results)]) == 0
    written = sorted(p.name for p in (results / "tables").iterdir())
    assert {"table3.md", "table3.tex", "table6.md", "table3_fake.md", "table4_fake.md"} <= set(written)
    assert "Preset `full`" in (results / "tables" / "table3.md").read_text()


def test_no_results_is_a_one_line_error_and_writes_nothing(results, capsys):
    assert make_tables.main(["--results", str(results), "--preset", "nothing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no cells under") and "PRESET=nothing" in err[0]
    assert not (results / "tables").exists()


def test_an_old_format_cell_is_a_one_line_error_naming_the_converter(results, capsys):
    path = results / "tabular" / "fake" / "table3" / "australian" / "logistic-stk.json"
    path.write_text('{"cell": {"table": "table3"}, "test_mean": 1.0}')
    assert make_tables.main(["--results", str(results), "--preset", "fake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logistic-stk.json" in err[0] and "scripts/convert_results.py" in err[0]
    assert not (results / "tables").exists()


def test_ties_of_cells_stored_before_ties_were_recorded_come_from_their_rounded_means():
    from topklab.report.tabular import cell_ties

    legacy = {
        "selected": {"index": 1},
        "combos": {"val_mean": [3.0, 2.5, 2.500001, 2.50001], "test_mean": [1.0, 7.0, 4.0, 9.0]},
    }
    ties = cell_ties(legacy)
    assert ties["indices"] == [1, 2] and (ties["test_min"], ties["test_max"]) == (4.0, 7.0)
    assert cell_ties({"ties": {"count": 5}, **legacy}) == {"count": 5}


def test_paired_p_value_needs_paired_samples():
    assert paired_p_value([1.0, 2.0], [1.0, 2.0]) == 1.0
    with pytest.raises(TopklabError, match="table3/x/logistic: stk vs atk needs the same splits"):
        paired_p_value([1.0, 2.0], [1.0, 2.0, 3.0], "table3/x/logistic: stk vs atk")


def test_vision_table_shows_mean_std_over_seeds_paper_values_order_and_per_class(results):
    shutil.copy(ROOT / "results" / "paper" / "petersen_icml2022.yaml", results / "paper")
    fake_vision_run(results, "petersen_cifar100", "softmax_ce", "Softmax CE", 0, 60.0, 84.0, [90.0, 50.0, 10.0])
    fake_vision_run(results, "petersen_cifar100", "softmax_ce", "Softmax CE", 1, 62.0, 86.0, [80.0, 70.0, 30.0])
    fake_vision_run(results, "petersen_cifar100", "neuralsort_top5", "NeuralSort", 0, 20.0, 80.0, [30.0, 20.0, 10.0])
    fake_vision_run(results, "petersen_cifar100", "extra", "not in the paper", 0, 1.0, 5.0, [1.0, 1.0, 1.0])
    assert make_tables.main(["--preset", "fake", "--results", str(results)]) == 0
    text = (results / "tables" / "petersen_cifar100.md").read_text()
    # top-1 from its own selection, top-5 from the top-5 selection (+1 in the fake), population std
    assert (
        "| Softmax CE | 2 | 61.00 ± 1.00 | 86.00 ± 1.00 | 85.00 ± 5.00 | 60.00 ± 10.00 | 20.00 ± 10.00 | 61.27 | 85.31 |"
        in text
    )
    assert "| Softmax CE | 85.0 | 60.0 | 20.0 |" in text
    assert (
        "| not in the paper | 1 | 1.00 ± 0.00 | 6.00 ± 0.00 | 1.00 ± 0.00 | 1.00 ± 0.00 | 1.00 ± 0.00 | — | — |" in text
    )
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "±" in line]
    assert rows == ["Softmax CE", "NeuralSort", "not in the paper"]  # the paper's order, then the rest by id
    assert "| row | seed 0 | seed 1 | median | range |" in text  # each seed's top-1, as selected
    assert "| Softmax CE | 60.00 | 62.00 | 61.00 | 60.00–62.00 |" in text
    assert "| NeuralSort | 20.00 | — | 20.00 | 20.00–20.00 |" in text


def test_a_corrupt_vision_result_is_a_one_line_error(results, capsys):
    path = fake_vision_run(results, "fmnistlt", "ce", "CE", 0, 60.0, 84.0, [90.0, 50.0, 10.0])
    path.write_text("{broken")
    assert make_tables.main(["--preset", "fake", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed0.json is corrupt" in err[0]


@pytest.mark.integration  # every committed result through every renderer: the default tier, not test-unit
def test_committed_tables_are_rendered_unchanged_from_the_committed_results():
    """Every file in results/tables/ is exactly what the renderers make of results/ (preset fraction,
    as `make tables`); fails if a renderer or a result drifts."""
    rendered = render_tables(ROOT / "results")
    committed = {p.name: p.read_text() for p in (ROOT / "results" / "tables").iterdir()}
    assert sorted(rendered) == sorted(committed)
    for name, text in committed.items():
        assert rendered[name] == text, f"results/tables/{name} differs from its rendering; run `make tables`"


def test_tables_1_and_2_beside_the_paper():
    import yaml

    from topklab.report.synthetic import render_table1, render_table2

    paper = yaml.safe_load((ROOT / "results/paper/stk_neurips2024.yaml").read_text())
    algorithms = {
        "HeapSort": {"level": "pure Python loops", "seconds": [0.1, 0.3], "mean": 0.2, "std": 0.1, "iterations": []},
        "STk": {"level": "torch", "seconds": [0.01], "mean": 0.0254, "std": 0.0, "iterations": [10, 30]},
    }
    table1 = make_result(
        "bench",
        "table1",
        {"algorithms": algorithms, "order": ["HeapSort", "STk"]},
        "python x",
        {"n": 10000, "k": 5, "runs": 2, "threads": 1},
        {"git": {"sha": "0123456789abc"}},
    )
    text = render_table1(table1, paper)
    assert "| HeapSort | pure Python loops | 0.1243 ± 0.045 | 0.2 ± 0.1 | 1.61 | — |" in text
    assert "| STk | torch | 0.0127 ± 0.002 | 0.0254 ± 0 | 2 | 20 (max 30) |" in text
    assert "n = 10000, k = 5, 2 runs" in text and "code 0123456789 (tree state unknown)." in text
    columns = {
        name: {"test_acc": [70.0, 80.0], "paraf1": [0.5, 0.5], "seconds_single": [1.0], "k": 0.5}
        for name in ("Average", "STk (SReLU)")
    }
    config = {
        "task": {"covariance": "printed"},
        "trainer": {"l1": 0.01, "lam_init": "auto"},
        "k_grid": [0.5],
        "support_tol": 0.01,
        "time_repeats": 1,
    }
    table2 = make_result(
        "synthetic",
        "table2",
        {"columns": columns, "order": ["Average", "STk (SReLU)"], "bayes_accuracy_balanced_test": 96.4},
        "python y",
        config,
        {},
    )
    text = render_table2(table2, paper)
    assert "| Accuracy (%), paper | 72.86 | 76.10 |" in text
    assert "| Accuracy (%), ours | 75.00 ± 5.00 | 75.00 ± 5.00 |" in text
    assert (
        "| ParaF1 (the paper's 10-entry w*), paper | 0.190 | 0.345 |" in text
        and "2 repeats, covariance `printed`" in text
    )
    assert "| Accuracy (%), ours median [q25, q75] | 75.00 [72.50, 77.50] | 75.00 [72.50, 77.50] |" in text
    assert "Bayes support" not in text  # a result from before the Bayes support was scored: the paper's ParaF1 only
    for column in columns.values():  # the current result's fields
        column.update(
            paraf1=[0.8, 1.0], paraf1_paper=[0.9, 0.9], best_step=[20, 3800], steps=[220, 3800], step_cap=3800
        )
    payload = {
        "columns": columns,
        "order": ["Average", "STk (SReLU)"],
        "bayes_accuracy_balanced_test": 96.4,
        "true_support": list(range(11)),
        "paper_support": list(range(10)),
    }
    text = render_table2(
        make_result("synthetic", "table2", payload, "python y", {**config, "scale": "atk", "suffix": "_scale_atk"}, {}),
        paper,
    )
    assert text.splitlines()[0].endswith("(covariance `printed`, scale `atk`)") and "coordinates 0–10 (11)" in text
    assert "| ParaF1 (Bayes support), ours | 0.900 ± 0.100 | 0.900 ± 0.100 |" in text
    assert "| ParaF1 (the paper's 10-entry w*), ours | 0.900 ± 0.000 | 0.900 ± 0.000 |" in text
    assert "| best step: median [min, max] | 1910 [20, 3800] | 1910 [20, 3800] |" in text
    assert (
        "| repeats at the 3,800-step cap | 1 | 1 |" in text and "| repeats whose best step is ≤ 200 | 1 | 1 |" in text
    )


def test_table_2_marks_the_columns_whose_lambda_left_the_band():
    import yaml

    from topklab.report.synthetic import column_band, render_table2

    paper = yaml.safe_load((ROOT / "results/paper/stk_neurips2024.yaml").read_text())
    names = ["Average", "MATk", "STk (SReLU)"]
    columns = {n: {"test_acc": [70.0, 80.0], "paraf1": [0.5, 0.5], "seconds_single": [1.0], "k": 0.5} for n in names}
    config = {
        "task": {"covariance": "printed"},
        "trainer": {"l1": 0.01, "lam_init": "auto"},
        "k_grid": [0.5],
        "support_tol": 0.01,
        "time_repeats": 1,
    }
    table2 = make_result(
        "synthetic",
        "table2",
        {"columns": columns, "order": names, "bayes_accuracy_balanced_test": 96.4},
        "y",
        config,
        {},
    )
    band = {
        "result": {
            "rows": [
                {"family": "synthetic", "row": "table2: MATk", "in_band": 0.95},
                {"family": "synthetic", "row": "table2: STk (SReLU)", "in_band": 0.3},
                {"family": "tabular", "row": "table3/x/logistic-stk.json", "in_band": 0.1},
            ]
        }
    }
    text = render_table2(table2, paper, column_band(band, "table2"))
    assert "| | Average | MATk | STk (SReLU) † |" in text
    assert "† λ in band on fewer than 90% of the steps when repeat 0 at the column's selected k is retrained" in text
    assert text.count("†") == 2 and "STk (SReLU) 0.30 (not STk)." in text and "MATk 0.95" not in text
    unmarked = render_table2(table2, paper, column_band(band, "table2_intended"))  # the band file is Table 2's
    assert "†" not in unmarked and "| | Average | MATk | STk (SReLU) |" in unmarked


def test_dirty_results_are_refused_unless_allowed_and_then_marked(results, capsys):
    path = results / "tabular" / "fake" / "table3" / "australian" / "logistic-stk.json"
    envelope = json.loads(path.read_text())
    envelope["provenance"]["git"]["dirty"] = True
    path.write_text(json.dumps(envelope))
    assert make_tables.main(["--results", str(results), "--preset", "fake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "uncommitted changes" in err[0]
        and "logistic-stk.json" in err[0]
        and "--allow-dirty" in err[0]
    )
    assert not (results / "tables").exists()
    assert make_tables.main(["--results", str(results), "--preset", "fake", "--allow-dirty"]) == 0
    assert "abc1234 (DIRTY tree)" in (results / "tables" / "table3_fake.md").read_text()


def test_the_tables_name_rows_not_stk_and_rows_partly_tracked_from_the_stored_flags():
    from topklab.losses.aggregate.lambda_monitor import LOW_BAND_FLAG, PARTLY_TRACKED_FLAG
    from topklab.report.tracking import band_cell, flag_lines

    def run(in_band, flag, judged_on=None):
        tracking = {"in_band": in_band, "flag": flag, **({"judged_on": judged_on} if judged_on else {})}
        return {"result": {"summary": {"lambda": 1.0, "lambda_tracking": tracking}}}

    rows = {
        "a": [run(0.0, LOW_BAND_FLAG), run(0.6, PARTLY_TRACKED_FLAG)],
        "b": [run(0.6, PARTLY_TRACKED_FLAG, "all steps")],
        "c": [run(0.95, None)],
    }
    labels = {"a": "A", "b": "B", "c": "C"}
    assert flag_lines(rows, labels) == [
        "",
        "**λ did not track the k-th loss, so these rows are not STk:** A.",
        "",
        "**λ partly tracked the k-th loss (in band on fewer than 90 % of the steps):** B.",
    ]
    cells = {row: band_cell([r["result"]["summary"] for r in runs]) for row, runs in rows.items()}
    assert cells == {"a": "0.30 ± 0.30 (flagged)", "b": "0.60 (all steps, partly tracked)", "c": "0.95"}
    assert flag_lines({"c": rows["c"]}, labels) == []


def test_the_translation_table_marks_resumed_runs_with_their_segments():
    import copy

    from topklab.report.translation import render_translation_table

    def load(row, seed):
        return json.loads((ROOT / "results" / "translation" / "multi30k" / row / f"seed{seed}.json").read_text())

    whole, split = load("average", 0), copy.deepcopy(load("average", 1))
    identity = {"device": "cpu", "cpu_capability": "AVX512", "threads": 1}
    split["result"]["summary"]["segments"] = [
        {**identity, "from_step": 0},
        {**identity, "cpu_capability": "AVX2", "from_step": 540},
    ]
    once = copy.deepcopy(load("average", 2))
    once["result"]["summary"]["segments"] = [{**identity, "from_step": 0}]  # one segment: not resumed
    text = render_translation_table("multi30k", {"average": [whole, split, once]})
    assert "| 37.64, 38.50 §, 38.55 |" in text and text.count("§") == 2
    assert (
        "§ Resumed runs: Average seed 1: segments from step 0 (device cpu, cpu_capability AVX512, threads 1); "
        "from step 540 (device cpu, cpu_capability AVX2, threads 1)." in text
    )
    assert "§" not in render_translation_table("multi30k", {"average": [whole, once]})
    unrecorded = render_translation_table("multi30k", {"atk": [load("atk", 1), load("atk", 2)]})
    assert "| 37.80, 38.56 § |" in unrecorded
    assert "ATk seed 2: restarted twice, resumed from its epoch-2 checkpoint" in unrecorded
    assert "its provenance records CPU capability AVX2, no earlier segment's." in unrecorded


def test_a_vision_table_marks_a_resumed_run_with_its_segments():
    import copy

    from topklab.report.vision import render_vision_table

    def load(seed):
        return json.loads((ROOT / "results" / "vision" / "fmnistlt" / "la" / f"seed{seed}.json").read_text())

    identity = {"device": "cpu", "cpu_capability": "AVX512", "threads": 1, "data": "abc"}
    split = copy.deepcopy(load(1))
    split["result"]["summary"]["segments"] = [
        {**identity, "from_step": 0, "to_step": 100},
        {**identity, "from_step": 100, "to_step": 200, "forced": True, "threads": 2},
    ]
    text = render_vision_table("fmnistlt", {"la": [load(0), split, load(2)]})
    assert text.count("§") == 2, text
    assert (
        "§ Resumed runs: " in text
        and "seed 1: segments from step 0" in text
        and "threads 2, data abc, forced True" in text
    )
    assert "§" not in render_vision_table("fmnistlt", {"la": [load(0), load(1), load(2)]})


def test_a_new_aggregate_renders_in_a_tabular_table_with_no_report_edit(results, tmp_path, monkeypatch):
    """An aggregate added as docs/layout.md says (a class in its own module, a yaml in configs/loss/)
    gets its line and its name in Tables 3 and 4: the report takes the name from the aggregate."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "bottomk_aggregate.py").write_text(
        "import torch\n"
        "from topklab.losses.aggregate.base import Aggregate\n\n\n"
        "class BottomK(Aggregate):\n"
        "    hyperparameters = ('k',)\n\n"
        "    def __init__(self, k):\n"
        "        super().__init__()\n"
        "        self.k = k\n\n"
        "    def batched(self, losses, k, lam, delta):\n"
        "        keep = torch.arange(losses.shape[1]) < k[:, None]\n"
        "        return (torch.sort(losses, dim=1).values * keep).sum(1) / k\n"
    )
    monkeypatch.syspath_prepend(str(modules))
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "configs" / "loss" / "bottomk.yaml").write_text("_target_: bottomk_aggregate.BottomK\nk: 0.5\n")
    monkeypatch.setenv("TOPKLAB_ROOT", str(tmp_path))
    paper = tmp_path / "paper" / "stk_neurips2024.yaml"
    spec = yaml.safe_load(paper.read_text())
    spec["table3"]["rows"]["australian"]["logistic/bottomk"] = [15.0, 1.0]
    paper.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
    hyper = {"k": 0.5, "C": 100.0, "lr": 0.01, "delta": 0.001}
    fake_cell(results, "table3", "australian", "logistic", "bottomk", [15.5, 14.5, 15.0, 15.0, 16.0, 14.0], hyper)

    rendered = render_tables(results, "fake")
    line = next(row for row in rendered["table3_fake.md"].splitlines() if "| BottomK" in row)
    assert line.startswith("| australian | logistic | BottomK |") and "15.00" in line
    assert "BottomK" in rendered["table3_fake.tex"]


def test_a_gpu_tables_k_sweep_is_rendered_beside_the_cpu_one():
    """Runs on a GPU are filed in ``multi30k_cuda``; the group's k sweep is drawn for them as well, from
    their own runs only."""
    import copy

    from topklab.report.schema import read_results
    from topklab.report.translation import render_translation

    cpu = read_results(ROOT / "results" / "translation", "translation")
    gpu = []
    seed_zero = (
        r for r in cpu if r["result"]["row"] in ("average", "stk_k50") and r["provenance"]["seeds"]["seed"] == 0
    )
    for result in seed_zero:
        moved = copy.deepcopy(result)
        moved["result"]["table"] = "multi30k_cuda"
        gpu.append(moved)
    rendered = render_translation(cpu + gpu, [], ROOT / "configs")
    assert {"multi30k_k.md", "multi30k_cuda_k.md"} <= set(rendered)
    assert "| STk | 0.5 | `stk_k50` | 1 | −2.34 | — (one seed) |" in rendered["multi30k_cuda_k.md"]
    assert "| STk | 0.96 | `stk` | 0 | not run |" in rendered["multi30k_cuda_k.md"]  # only the GPU's own runs
    assert "| STk | 0.96 | `stk` | 3 |" in rendered["multi30k_k.md"]
