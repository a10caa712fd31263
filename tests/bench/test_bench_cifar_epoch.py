"""``python -m benchmarks cifar_epoch`` end to end on 2 images per class: both data paths train the
la_stk row for two epochs, and the table, the ratio and the projection come from the engine's epoch log."""

import json

import pytest

from benchmarks.cifar_epoch import epoch_seconds
from benchmarks.harness import main


@pytest.mark.integration
def test_both_data_paths_train_and_the_table_reads_their_epoch_log(tmp_path, capsys):
    args = ["--epochs", "2", "--workers", "0", "--per-class", "2", "--out-dir", str(tmp_path)]
    assert main(["cifar_epoch", *args]) == 0
    result = json.loads((tmp_path / "cifar_epoch_cpu.json").read_text())["result"]
    rows = {row["loader"]: row for row in result["rows"]}
    assert sorted(rows) == ["device", "torchvision"]
    for row in rows.values():
        assert len(row["epoch_seconds"]) == 2 and all(s > 0 for s in row["epoch_seconds"])
        assert row["median_epoch_s"] == row["epoch_seconds"][1]  # the first epoch is left out
        assert row["projected_recipe_hours"] == pytest.approx(row["median_epoch_s"] * 200 / 3600)
    assert result["ratio"] == pytest.approx(rows["torchvision"]["median_epoch_s"] / rows["device"]["median_epoch_s"])
    assert capsys.readouterr().out.rstrip().endswith(f"ratio torchvision/device epoch time: {result['ratio']:.2f}")
    assert (tmp_path / "cifar_epoch_cpu.md").read_text().count("| device | 0 |") == 1


def test_an_epoch_log_gives_each_epochs_own_seconds(tmp_path):
    (tmp_path / "epochs.csv").write_text("epoch,elapsed_s\n1,10.0\n2,13.5\n3,16.0\n")
    assert epoch_seconds(tmp_path) == [10.0, 3.5, 2.5]


def test_one_epoch_is_refused_in_one_line(capsys):
    assert main(["cifar_epoch", "--epochs", "1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
