"""scripts/bench_operators.py runs end to end on tiny sizes (its numbers are not asserted: speed is
checked by running the benchmark, never by a timed unit test)."""

import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "bench_operators.py"


@pytest.mark.integration
def test_quick_mode_ends_with_the_speedup_line():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--quick-rounds", "1"], capture_output=True, text=True, check=True
    )
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"speedup vs difftopk: \d+\.\d", last)
    assert "max |P_topk difference|" in done.stdout


@pytest.mark.slow
def test_full_mode_writes_the_table_json_and_plot(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--operators",
            "dftopk",
            "odd_even",
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
    )
    assert done.stdout.strip().splitlines()[-1].startswith("speedup vs difftopk: ")
    table = (tmp_path / "operators_test.md").read_text()
    assert "| dftopk |" in table and "| odd_even |" in table and "n=10" in table
    result = json.loads((tmp_path / "operators_test.json").read_text())
    rows = {r["operator"]: r for r in result["result"]["rows"]}
    assert [s["n"] for s in rows["odd_even"]["speed"]] == [5, 10] and rows["odd_even"]["output"] == "permutation"
    assert rows["dftopk"]["output"] == "soft_topk" and result["provenance"]["git"]
    assert (tmp_path / "operators_test.png").stat().st_size > 0
    (tmp_path / "operators_test.md").unlink()
    subprocess.run(
        [sys.executable, str(SCRIPT), "--render", str(tmp_path / "operators_test.json")],
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "operators_test.md").read_text() == table  # redrawn from the JSON alone
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", str(tmp_path / "missing.json")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "is not a result JSON" in bad.stderr


def test_unknown_operator_is_a_one_line_error():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--operators", "quicksort", "--no-train"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown operator(s) quicksort" in done.stderr
