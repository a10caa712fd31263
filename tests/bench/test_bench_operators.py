"""``python -m benchmarks operators`` runs end to end on tiny sizes (its numbers are not asserted: speed is
checked by running the benchmark, never by a timed unit test); its memory guard stops an allocation
past the limit; the peer table renders every state of a pair."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from benchmarks.harness import main
from benchmarks.harness.isolation import run_isolated
from benchmarks.operators import OVER_MEMORY, PEERS, render_peers
from helpers import ROOT

BENCHMARK = [sys.executable, "-m", "benchmarks", "operators"]


@pytest.mark.slow
@pytest.mark.integration
def test_quick_mode_ends_with_the_speedup_line():
    done = subprocess.run(
        [*BENCHMARK, "--quick", "--quick-rounds", "1"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"speedup vs difftopk: \d+\.\d", last)
    assert "max |P_topk difference|" in done.stdout


def test_quick_mode_on_small_logits_ends_with_the_speedup_line(monkeypatch, capsys):
    """The fast counterpart of the slow test above: the same --quick run on (8, 12) logits, in process
    (difftopk's dense path on the CIFAR-100 shape takes most of a minute)."""
    pytest.importorskip("difftopk")
    from benchmarks import operators

    monkeypatch.setattr(operators, "QUICK", {**operators.QUICK, "batch": 8, "classes": 12})
    assert main(["operators", "--quick", "--quick-rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "top-k CE (P_K = [.2]*5, batch 8, n = 12)" in out and "max |P_topk difference|" in out
    assert re.fullmatch(r"speedup vs difftopk: \d+\.\d", out.strip().splitlines()[-1])


@pytest.mark.slow
def test_full_mode_writes_the_table_json_and_plot(tmp_path):
    done = subprocess.run(
        [
            *BENCHMARK,
            "--operators",
            "dftopk",
            "odd_even",
            "sparse_topk",
            "--sizes",
            "5",
            "10",
            "--large-sizes",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--no-train",
            "--quick-rounds",
            "1",
            "--out-dir",
            str(tmp_path),
            "--tag",
            "test",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert done.stdout.strip().splitlines()[-1].startswith("speedup vs difftopk: ")
    table = (tmp_path / "operators_test.md").read_text()
    assert "| dftopk |" in table and "| odd_even |" in table and "n=10" in table
    result = json.loads((tmp_path / "operators_test.json").read_text())
    rows = {r["operator"]: r for r in result["result"]["rows"]}
    assert [s["n"] for s in rows["odd_even"]["speed"]] == [5, 10] and rows["odd_even"]["output"] == "permutation"
    assert rows["dftopk"]["output"] == "soft_topk" and result["provenance"]["git"]
    pairs = {(p["operator"], p["peer"]): p for p in result["result"]["peers"]}
    assert set(pairs) == {(name, peer) for name, peer, _ in PEERS if name in ("odd_even", "sparse_topk")}
    for key in [("odd_even", "difftopk"), ("odd_even", "diffsort"), ("sparse_topk", "python_pav")]:
        assert [s["n"] for s in pairs[key]["sizes"]] == [5, 10] and pairs[key]["sizes"][-1]["max_abs_difference"] < 4e-5
    assert "## Ours against every installed peer, side by side" in table
    assert "| sparse_topk | ours with kernel='python' (the Python PAV) | 10 |" in table
    assert (tmp_path / "operators_test.png").stat().st_size > 0
    (tmp_path / "operators_test.md").unlink()
    render = [sys.executable, "-m", "benchmarks", "render"]
    subprocess.run([*render, str(tmp_path / "operators_test.json")], check=True, capture_output=True, cwd=ROOT)
    assert (tmp_path / "operators_test.md").read_text() == table  # redrawn from the JSON alone


def test_unknown_operator_is_a_one_line_error():
    done = subprocess.run(
        [*BENCHMARK, "--operators", "quicksort", "--no-train"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and "unknown operator(s) quicksort" in done.stderr


@pytest.mark.integration
def test_the_memory_guard_turns_an_allocation_past_the_limit_into_a_skipped_row():
    script = textwrap.dedent(
        """
        import json, torch
        from benchmarks.operators import failed_row, guard_memory

        guard_memory(0.25, "cpu")
        small = torch.ones(2**24)  # 64 MiB: inside the limit
        try:
            torch.ones(2**28)  # 1 GiB
        except (RuntimeError, MemoryError) as err:
            print(json.dumps({"row": failed_row(err), "small": float(small.sum())}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120, cwd=ROOT
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"row": {"skipped": OVER_MEMORY}, "small": 2.0**24}


@pytest.mark.integration
def test_a_pair_is_measured_side_by_side_in_its_own_process():
    options = {"operator": "sparse_topk", "peer": "python_pav", "sizes": [5, 40], "device": "cpu", "repeats": 3}
    options.update(warmup=1, max_seconds=5.0, memory_limit_gb=2.0, peer_batch=3)
    result = run_isolated("benchmarks.operators:measure_peer_options", options)
    assert result["output"] == "soft_topk" and [(s["n"], s["batch"]) for s in result["sizes"]] == [(5, 3), (40, 3)]
    for size in result["sizes"]:
        assert size["max_abs_difference"] == 0.0  # the C++ and the Python PAV give the same bits
        assert size["repeats"] == 3 and size["ours_ms"] > 0 and size["peer_over_ours"] > 0


def test_the_peer_table_renders_every_state_of_a_pair():
    measured = {"n": 100, "k": 50, "ours_ms": 0.5, "peer_ms": 2.0, "peer_over_ours": 4.0, "repeats": 20}
    measured.update(max_abs_difference=3e-8, ours_peak_mb=0.1, peer_peak_mb=40.0)
    stopped = {**measured, "n": 500, "peer_ms": 6000.0, "peer_over_ours": 12000.0, "repeats": 1, "stopped": True}
    skipped = {"n": 1000, "k": 500, "ours_ms": 9.0, "repeats": 1, "ours_peak_mb": 1.0, "peer": {"skipped": OVER_MEMORY}}
    pairs = [
        {"operator": "odd_even", "peer": "difftopk", "label": "difftopk dense", "sizes": [measured, stopped, skipped]},
        {"operator": "sparse_topk", "peer": "torchsort", "label": "torchsort", "error": "not installed"},
    ]
    lines = render_peers({"peers": pairs, "memory_limit_gb": 4.0, "peer_batch": 1})
    assert "| odd_even | difftopk dense | 100 | 0.5 | 2 | 4.00 | 3.0e-08 | 0.1 | 40.0 |" in lines
    stopped_row = "| odd_even | difftopk dense | 500 | 0.5 | 6e+03 | 12000.00 (one call, stopped: over time) |"
    assert any(line.startswith(stopped_row) for line in lines)
    assert "| odd_even | difftopk dense | 1,000 | 9 | skipped: over memory limit (the peer) | — | — | — | — |" in lines
    assert "Not measured: torchsort for sparse_topk (not installed)." in lines
    assert render_peers({"rows": []}) == []  # a result written before the peer table


def test_the_k_sweep_times_each_operator_against_k_at_one_n(tmp_path, capsys):
    """``--k-sweep``: per operator (each in its own process) the time and peak memory at k = 1 and fractions of n
    of one row; a table with a column per k, its own file beside the full table's."""

    argv = ["--k-sweep", "--k-n", "40", "--operators", "softsort", "--max-seconds", "0.5"]
    assert main(["operators", *argv, "--repeats", "3", "--warmup", "1", "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "operators_k_cpu.json").read_text())["result"]
    assert result["n"] == 40 and [row["operator"] for row in result["rows"]] == ["softsort"]
    for row in result["rows"]:
        assert [s["k"] for s in row["speed"]] == [1, 4, 20, 36] and all(s["ms"] > 0 for s in row["speed"])
    table = (tmp_path / "operators_k_cpu.md").read_text()
    assert "| operator | k=1 | k=4 | k=20 | k=36 |" in table and table.count("| softsort |") == 2
