"""scripts/make_tables.py on a small fake results tree."""
import json
import shutil
import sys

import numpy as np
import pytest
from scipy.stats import wilcoxon

from conftest import ROOT
from topklab.protocol.tables import paired_p_value
from topklab.utils.errors import TopklabError

sys.path.insert(0, str(ROOT / "scripts"))
import make_tables  # noqa: E402


def fake_cell(results, table, dataset, individual, aggregate, test, selected):
    record = {"cell": {"table": table, "dataset": dataset, "individual": individual, "aggregate": aggregate},
              "test_mean": float(np.mean(test)), "test_std": float(np.std(test)),
              "per_split": {"test": list(test)}, "selected": {"index": 0, **selected},
              "command": "python scripts/reproduce_tabular.py preset=fake", "provenance": {"git": {"sha": "abc1234"}}}
    path = results / "tabular" / "fake" / table / dataset / f"{individual}-{aggregate}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


@pytest.fixture
def results(tmp_path):
    (tmp_path / "paper").mkdir()
    shutil.copy(ROOT / "results" / "paper" / "stk_neurips2024.yaml", tmp_path / "paper")
    hyper = {"k": 0.5, "C": 100.0, "lr": 0.01, "delta": 0.001}
    stk = [13.0, 13.5, 12.0, 14.0, 13.2, 12.8]
    fake_cell(tmp_path, "table3", "australian", "logistic", "stk", stk, hyper)
    fake_cell(tmp_path, "table3", "australian", "logistic", "atk", [16.0, 17.5, 15.0, 14.5, 16.5, 17.0], hyper)
    fake_cell(tmp_path, "table3", "australian", "logistic", "average", stk, hyper)
    fake_cell(tmp_path, "table6", "sinc", "square", "stk", [0.15, 0.14, 0.16, 0.15, 0.14, 0.16], hyper)
    return tmp_path


def test_tables_show_paper_ours_difference_mark_and_paired_tests(results):
    assert make_tables.main(["--results", str(results), "--preset", "fake"]) == 0
    md = (results / "tables" / "table3.md").read_text()
    stk = [13.0, 13.5, 12.0, 14.0, 13.2, 12.8]
    row = next(line for line in md.splitlines() if line.startswith("| australian | logistic | STk |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "13.358 ± 0.982"
    assert cells[4] == f"{np.mean(stk):.3f} ± {np.std(stk):.3f}"
    assert cells[5] == f"{np.mean(stk) - 13.358:.3f}" and cells[6] == "✓"
    assert cells[7] == "C=100, η=0.01, k=0.5, δ=0.001"
    atk = next(line for line in md.splitlines() if line.startswith("| australian | logistic | ATk |"))
    assert atk.split("|")[6].strip() == "1.655" and atk.split("|")[7].strip() == ""  # 16.083 vs 14.428 ± 1.056
    p = wilcoxon(stk, [16.0, 17.5, 15.0, 14.5, 16.5, 17.0]).pvalue
    test_row = next(line for line in md.splitlines() if line.startswith("| australian | logistic | ATk | 6 |"))
    assert test_row.split("|")[7].strip() == f"{p:.3g}" and test_row.split("|")[6].strip() == "6/0/0"
    same = next(line for line in md.splitlines() if line.startswith("| australian | logistic | Average | 6 |"))
    assert same.split("|")[5].strip() == "+0.000" and same.split("|")[7].strip() == "1"
    assert "Missing cells (32)" in md and "| german | logistic | STk | 25.561 ± 1.988 | — | — | — | — |" in md
    assert "preset=fake" in md and "abc1234" in md
    tex = (results / "tables" / "table6.tex").read_text()
    assert r"sinc & square & STk & $0.1446 \pm 0.0070$ & $0.1500 \pm 0.0082$ & 0.0054 & \checkmark \\" in tex
    assert (results / "tables" / "table4.md").exists()


def test_no_results_is_a_one_line_error_and_writes_nothing(results, capsys):
    assert make_tables.main(["--results", str(results), "--preset", "nothing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no cells under") and "preset=nothing" in err[0]
    assert not (results / "tables").exists()


def test_paired_p_value_needs_paired_samples():
    assert paired_p_value([1.0, 2.0], [1.0, 2.0]) == 1.0
    with pytest.raises(TopklabError, match="table3/x/logistic: stk vs atk needs the same splits"):
        paired_p_value([1.0, 2.0], [1.0, 2.0, 3.0], "table3/x/logistic: stk vs atk")


def fake_vision_run(results, table, row, seed, top1, top5, per_class):
    test = {"top1": top1, "top5": top5, "many": per_class[0], "medium": per_class[1], "few": per_class[2],
            "per_class": per_class, "score": top1}
    result = {"command": f"python train.py vision={table}/{row} seed={seed}", "provenance": {"git": {"sha": "def5678"}},
              "config": {"trainer": {"epochs": 3, "batch_size": 8, "select_metrics": ["top1", "top5"]}},
              "summary": {"metrics": {"test": test}, "class_counts": [150, 50, 5],
                          "selection": {"top1": {"test": top1}, "top5": {"test": top5 + 1.0}}}}
    path = results / "vision" / table / row / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def test_vision_table_shows_mean_std_over_seeds_paper_values_and_per_class(results, tmp_path):
    shutil.copy(ROOT / "results" / "paper" / "petersen_icml2022.yaml", results / "paper")
    experiments = tmp_path / "experiments"
    (experiments / "petersen_cifar100").mkdir(parents=True)
    (experiments / "petersen_cifar100" / "softmax_ce.yaml").write_text('row: "Softmax CE"\n')
    fake_vision_run(results, "petersen_cifar100", "softmax_ce", 0, 60.0, 84.0, [90.0, 50.0, 10.0])
    fake_vision_run(results, "petersen_cifar100", "softmax_ce", 1, 62.0, 86.0, [80.0, 70.0, 30.0])
    assert make_tables.main(["--preset", "fake", "--results", str(results), "--experiments", str(experiments)]) == 0
    text = (results / "tables" / "petersen_cifar100.md").read_text()
    # top-1 from its own selection, top-5 from the top-5 selection (+1 in the fake), population std
    assert "| Softmax CE | 2 | 61.00 ± 1.00 | 86.00 ± 1.00 | 85.00 ± 5.00 | 60.00 ± 10.00 | 20.00 ± 10.00 | 61.27 | 85.31 |" in text
    assert "| Softmax CE | 85.0 | 60.0 | 20.0 |" in text
    (results / "vision" / "petersen_cifar100" / "softmax_ce" / "seed1.json").write_text("{broken")
    assert make_tables.main(["--preset", "fake", "--results", str(results), "--experiments", str(experiments)]) == 2
