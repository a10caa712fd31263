"""``python -m benchmarks embeddings`` in its quick mode: extraction throughput through the real extractor,
head steps of two rows through the rows' own seams, and the epoch arithmetic of its table."""

import json

import pytest

from benchmarks.harness import main


@pytest.mark.integration
def test_the_quick_benchmark_writes_its_rows_and_table(tmp_path):
    assert main(["embeddings", "--quick", "--out", str(tmp_path / "embeddings_cpu.json"), "--work", str(tmp_path)]) == 0
    envelope = json.loads((tmp_path / "embeddings_cpu.json").read_text())
    rows = envelope["result"]["rows"]
    extraction = [r for r in rows if r["part"] == "extraction"]
    heads = {r["method"]: r for r in rows if r["part"] == "head"}
    assert [r["name"] for r in extraction] == ["test_efficientnet"] and extraction[0]["images_per_s"] > 0
    assert extraction[0]["hours_imagenet1k"] == pytest.approx(1_331_167 / extraction[0]["images_per_s"] / 3600)
    assert set(heads) == {"softmax_ce", "bitonic_uniform"} and heads["bitonic_uniform"]["m"] == 16
    for r in heads.values():
        assert r["steps_per_epoch"] == (1_281_167 - 50_000) // 500 and r["evaluations_per_epoch"] == 25
        epoch_s = r["steps_per_epoch"] * r["step_s"] + r["evaluations_per_epoch"] * 50_000 / r["validation_rows_per_s"]
        assert r["epoch_h"] == pytest.approx(epoch_s / 3600) and r["run_h"] == pytest.approx(20 * r["epoch_h"])
    text = (tmp_path / "embeddings_cpu.md").read_text()
    assert (
        "| stand-in: test_efficientnet | 224 px, fp32 |" in text
        and "| imagenet1k | bitonic_uniform | 100 | 16 |" in text
    )
    assert envelope["provenance"]["git"]["sha"] and envelope["command"].startswith(
        "python -m benchmarks embeddings --quick"
    )
