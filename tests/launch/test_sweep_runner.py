"""scripts/run_sweep.py: stored results are skipped, a failed job never stops the others, seeds run in order."""

import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import run_sweep  # noqa: E402


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(run_sweep, "ROOT", tmp_path)
    declared = {"la": 2, "la_stk": 2, "other": None}
    monkeypatch.setattr(
        run_sweep,
        "filing",
        lambda row: {
            "folder": "vision",
            "table": "t",
            "row": row.split("/")[-1],
            "seeds": declared[row.split("/")[-1]],
        },
    )
    ran = []

    def fake_job(row, seed, threads, logs):
        ran.append((row.split("/")[-1], seed))
        return (3 if (row.endswith("/la_stk") and seed == 0) else 0), 0.0

    monkeypatch.setattr(run_sweep, "run_job", fake_job)
    stored = tmp_path / "results" / "vision" / "t" / "la" / "seed0.json"
    stored.parent.mkdir(parents=True)
    stored.write_text("{}")
    return ran


def test_stored_runs_are_skipped_and_a_failure_stops_nothing(sweep, capsys):
    rows = ["fmnistlt_full/la", "fmnistlt_full/la_stk"]
    assert run_sweep.main([*rows, "--seeds", "0", "1", "--jobs", "1"]) == 1
    assert sweep == [("la_stk", 0), ("la", 1), ("la_stk", 1)]  # seed by seed; la seed 0 is stored
    out, err = capsys.readouterr()
    assert "1 of 4 runs stored; 3 to run" in out and "failed: fmnistlt_full/la_stk seed 0" in err


def test_patterns_name_rows_once_without_the_shared_parts():
    rows = run_sweep.expand_rows(["fmnistlt_full/la", "fmnistlt_full/*"])
    assert rows[0] == "fmnistlt_full/la" and len(rows) == len(set(rows)) == 9 and "fmnistlt_full/_common" not in rows


def test_a_pattern_that_names_no_row_is_a_one_line_error(sweep, capsys):
    assert run_sweep.main(["no_such_group/*"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and sweep == []


def test_without_seeds_each_row_runs_its_declared_count(sweep, capsys):
    assert run_sweep.main(["fmnistlt_full/la", "fmnistlt_full/la_stk", "--jobs", "1"]) == 1
    assert sweep == [("la_stk", 0), ("la", 1), ("la_stk", 1)]  # seeds 0 and 1 of the declared 2; la seed 0 is stored


def test_a_row_without_a_declared_count_needs_seeds_in_one_line(sweep, monkeypatch, capsys):
    monkeypatch.setattr(run_sweep, "expand_rows", lambda patterns: ["g/other"])
    assert run_sweep.main(["g/other"]) == 2
    assert "declares no seed count" in capsys.readouterr().err and sweep == []


def test_the_real_groups_declare_what_the_sweep_runs():
    assert run_sweep.filing("fmnistlt_full/la")["seeds"] == 5
    assert run_sweep.filing("stk/multi30k/stk_k50")["seeds"] == 3
