"""The selection and routing benchmarks run end to end and write result envelopes the tables read."""

import json

import pytest

from benchmarks.harness import main


def test_sparsification_benchmark_times_every_selector_and_checks_what_it_sent(tmp_path):
    out = tmp_path / "sparsification_cpu.json"
    assert main(["sparsification", "--sizes", "20000", "--ratios", "0.01", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["family"] == "bench"
    rows = result["result"]["rows"]
    assert [r["selector"] for r in rows] == [
        "exact top-k",
        "sampled threshold, bracketed to k",
        "STk threshold, cold",
        "STk threshold, warm",
        "STk threshold (native), cold",
        "STk threshold (native), warm",
        "bandwidth floor: x.abs().sum()",
    ]
    assert rows[0]["vs_topk"] == 1.0 and rows[0]["recall"] == 1.0 and rows[-1]["vs_floor"] == 1.0
    selectors = rows[:-1]
    assert all(0.8 <= r["count_over_k"] <= 1.1 and r["recall"] >= 0.8 for r in selectors)
    assert rows[1]["count_over_k"] == 1.0 and rows[1]["sent_over_k_p5_p95"] == [1.0, 1.0]  # never fewer than k
    assert all(r["passes"] >= 8 for r in rows[2:4]) and all(r["ns_per_element"] > 0 for r in rows)
    eager_cold, native_cold = rows[2], rows[4]  # the same Newton steps: one C++ pass each instead of six
    assert native_cold["passes"] - 2 == (eager_cold["passes"] - 2) // 6


def test_benchmarks_refuse_a_missing_gpu_with_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["sparsification", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_routing_benchmark_routes_the_asked_fraction(tmp_path):
    out = tmp_path / "routing_cpu.json"
    assert main(["routing", "--capacities", "0.5", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["result"]["rows"]
    top_k = [r for r in rows if r["variant"].startswith("top-k")]
    assert len(rows) == 6 and all(r["routed_fraction"] == 0.5 for r in top_k)


def test_routing_benchmark_quick_mode_routes_the_asked_fraction(tmp_path):
    """The fast counterpart of the slow test above: the same comparison on the small model and batch."""
    out = tmp_path / "routing_quick.json"
    assert main(["routing", "--quick", "--capacities", "0.5", "--repeats", "1", "--out", str(out)]) == 0
    assert (
        json.loads(out.read_text())["experiment"] == "routing_cpu"
    )  # the file's name is the caller's; the result's is not
    result = json.loads(out.read_text())["result"]
    top_k = [r for r in result["rows"] if r["variant"].startswith("top-k")]
    assert result["quick"] is True and len(result["rows"]) == 3
    assert [r["routed_fraction"] for r in top_k] == [0.5]
    assert [r["routed_fraction"] for r in result["rows"] if r["variant"] == "dense"] == [1.0]


def test_routing_quick_mode_without_a_file_is_refused_in_one_line(capsys):
    assert main(["routing", "--quick"]) == 2
    assert "--quick measures nothing" in capsys.readouterr().err


def test_an_out_file_that_is_no_json_is_refused_before_measuring(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sparsification", "--sizes", "20000", "--out", "table.txt"])
    assert exit_.value.code == 2 and "is no .json file" in capsys.readouterr().err
