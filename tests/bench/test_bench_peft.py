"""``python -m benchmarks peft``: one process per branch, the branch's real trainable-parameter count, and the
GPU-hour estimate's arithmetic."""

import json

import pytest

from benchmarks import peft as bench_peft
from benchmarks.harness import main


@pytest.mark.integration
def test_the_benchmark_measures_each_branch_and_writes_its_table(tmp_path):
    from topklab.models.peft import LinearProbe, PeftViT

    code = main(
        [
            "peft",
            "--backbone",
            "vit_tiny_patch16_224",
            "--img-size",
            "32",
            "--batch",
            "4",
            "--steps",
            "1",
            "--tuners",
            "adaptformer",
            "linear_probe",
            "--out-dir",
            str(tmp_path),
        ]
    )
    envelope = json.loads((tmp_path / "peft_cpu.json").read_text())
    out = envelope["result"]
    assert envelope["provenance"]["git"]["sha"] and envelope["config"]["batch"] == 4
    assert code == 0 and [r["tuner"] for r in out["rows"]] == ["adaptformer", "linear_probe"]
    probe = PeftViT(100, backbone="vit_tiny_patch16_224", tuner=LinearProbe(), img_size=32)
    assert out["rows"][1]["trainable"] == probe.trainable_parameters < out["rows"][0]["trainable"]
    assert all(
        r["train_images_per_s"] > 0 and r["train_gflops_per_image"] > r["eval_gflops_per_image"] > 0
        for r in out["rows"]
    )
    assert "| adaptformer |" in (tmp_path / "peft_cpu.md").read_text() and out["estimates"] == []


def test_gpu_hours_are_images_times_flops_over_the_rate():
    rows = {
        "adaptformer": {"train_gflops_per_image": 3.0, "eval_gflops_per_image": 1.0},
        "full": {"train_gflops_per_image": 6.0, "eval_gflops_per_image": 1.0},
    }
    estimates = {
        e["table"]: e["gpu_hours_per_seed"] for e in bench_peft.table_hours(rows, {"adaptformer": 1.0, "full": 1.0})
    }
    cifar = 3 * (10 * 10_837 * 3.0 + (10 * 1_000 + 10_000) * 1.0) * 1e9 / 1e12 / 3600
    imagenet = 3 * (10 * 115_846 * 3.0 + (10 * 20_000 * 5 + 50_000 * 5) * 1.0) * 1e9 / 1e12 / 3600
    places = 3 * (10 * 62_500 * 3.0 + (10 * 7_300 * 5 + 36_500 * 5) * 1.0) * 1e9 / 1e12 / 3600
    assert abs(estimates["Table 5 (vision columns)"] - (cifar + imagenet + places)) < 1e-9
    assert estimates["Table 7 (MAE rows)"] > 50 * estimates["Table 5 (vision columns)"]  # 61 M images against 2.7 M


def test_the_objective_option_measures_average_in_place_of_stk(tmp_path):
    argv = ["--backbone", "vit_tiny_patch16_224", "--img-size", "32", "--batch", "4", "--steps", "1"]
    code = main(["peft", *argv, "--tuners", "linear_probe", "--objective", "average", "--out-dir", str(tmp_path)])
    out = json.loads((tmp_path / "peft_cpu.json").read_text())["result"]
    assert code == 0 and out["objective"] == "average" and 0 < out["rows"][0]["loss_share"] < 1
    assert "objective: LA + Average;" in (tmp_path / "peft_cpu.md").read_text()
