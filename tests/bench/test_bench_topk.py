"""``python -m benchmarks topk``: one worker measures its points, the report's ratios and headline."""

import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.fixture(scope="module")
def bench_topk():
    from benchmarks import topk as bench_topk

    return bench_topk


def test_losses_cover_both_kernel_paths(bench_topk):
    assert {
        "ATk (sort)",
        "ATk (topk)",
        "MATk (eager)",
        "MATk (compiled)",
        "MATk (native)",
        "STk (eager)",
        "STk (compiled)",
        "STk (native)",
    } <= set(bench_topk.LOSSES)
    assert bench_topk.QUICK_LOSSES == ["Average", "ATk (topk)", "STk (eager)", "STk (compiled)", "STk (native)"]
    assert bench_topk.make_loss("STk (native)", 7).kernel == "native"
    assert [bench_topk.headline_loss(d) for d in ("cpu", "cuda")] == ["STk (native)", "STk (compiled)"]


def test_worker_measures_each_point(bench_topk):
    rows = bench_topk.worker("STk (eager)", [(1000, 100), (2000, 5)], "cpu", min_time=0.01, threads=1)
    assert [(r["n"], r["k"]) for r in rows] == [(1000, 100), (2000, 5)]
    assert all(r["seconds"] > 0 and r["repeats"] >= 3 and r["peak_bytes"] >= 0 for r in rows)
    (quiet,) = bench_topk.worker("Average", [(1000, 1)], "cpu", min_time=0.01, threads=1, measure_memory=False)
    assert quiet["peak_bytes"] is None


MACHINE = {"processor": None, "machine": "test machine", "cpu_count": 2, "torch_threads": 1, "gpus": ["GPU"]}


def stored(experiment: str, payload: dict, config: dict, command: str = "python -m benchmarks topk") -> dict:
    """A result envelope as the harness stores it, for a renderer (which reads nothing else)."""
    return {
        "experiment": experiment,
        "result": payload,
        "config": config,
        "command": command,
        "provenance": {"hardware": MACHINE},
    }


def fake_results(bench_topk, ns, seconds):
    rows = []
    for n in ns:
        for name in bench_topk.QUICK_LOSSES:
            for label in bench_topk.k_values(n) if name in bench_topk.USES_K else ["-"]:
                rows.append(
                    {"loss": name, "n": n, "k_label": label, "seconds": seconds(name, n, label), "peak_bytes": None}
                )
    return rows


def test_headline_is_the_worst_compiled_stk_ratio_from_1e5(bench_topk):
    def seconds(name, n, label):
        if name == "STk (native)":
            return {"5": 1.2, "0.1n": 1.4, "0.9n": 1.1}[label] * (5 if n < 10**5 else 1)
        return {
            "Average": 1.0,
            "ATk (topk)": 3.0 if label == "0.9n" else 0.5,
            "STk (eager)": 9.0,
            "STk (compiled)": 2.0,
        }[name]

    rows = fake_results(bench_topk, [10**4, 10**5, 10**6], seconds)
    assert bench_topk.headline(rows, "STk (native)") == pytest.approx(1.4)  # n = 1e4's 7.0 does not count
    config = {"device": "cpu", "threads": 1, "quick": True}
    text = bench_topk.render(stored("topk_cpu_quick", {"results": rows}, config, "python -m benchmarks topk --quick"))
    assert text.startswith(
        "# Aggregate losses: forward + backward on n float32 losses (cpu; test machine, 2 cores, 1 torch"
    )
    assert "| STk (native) | 0.1n | 7e+03 ms | 1.4e+03 ms | 1.4e+03 ms |" in text
    assert "| 1e+05 | 9.00 | 2.00 | 1.40 | 0.42, 0.36, 2.73 |" in text
    assert "- STk (native) is faster at: (n=1e5, k=0.9n); (n=1e6, k=0.9n)." in text
    assert text.rstrip().endswith(
        "worst STk/Average ratio (n >= 1e5): 1.40 (STk (native), the path of kernel=auto here; every k)"
    )


def run(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", "topk", *args], capture_output=True, text=True, cwd=ROOT)


def test_bad_exponents_fail_in_one_line(tmp_path):
    out = run("--min-exp", "5", "--max-exp", "4", "--out-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip() == "error: need 1 <= --min-exp <= --max-exp <= 9, got 5, 4"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_script_writes_the_table_and_ends_with_the_headline(tmp_path):
    out = run(
        *("--min-exp", "5", "--max-exp", "5", "--min-time", "0.01", "--sizes", "16", "--rounds", "1"),
        *("--against-time", "0.05"),
        *("--out-dir", str(tmp_path)),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("worst STk/Average ratio (n >= 1e5): ") for line in lines)
    assert lines[-1].startswith("worst ratio to the plain torch expression: ")
    assert {p.name for p in tmp_path.iterdir()} == {
        *("topk_cpu.json", "topk_cpu.md", "topk_cpu.png"),
        *("topk_against_torch_cpu.json", "topk_against_torch_cpu.md"),
    }


def test_the_against_torch_worker_times_every_pair_side_by_side():
    from benchmarks import against_torch

    row = against_torch.worker(64, 0.1, rounds=2, min_time=0.02, threads=1)
    assert row["n"] == 64 and row["k"] == 6 and row["loops"] >= 1
    assert set(row["seconds"]) == set(against_torch.TARGETS) | set(against_torch.PLAIN.values()) | {
        against_torch.CONTROL
    }
    assert all(seconds > 0 for seconds in row["seconds"].values())
    assert set(row["ratios"]) == set(against_torch.TARGETS) | {against_torch.CONTROL}
    assert all(ratio > 0 for ratio in row["ratios"].values())


def test_the_against_torch_table_ends_with_the_worst_ratio_against_its_target():
    from benchmarks import against_torch

    plain = {"x.mean()": 1.0, "x.max()": 2.0, "x.topk(k).values.mean()": 4.0}
    rows = [
        {"n": 16, "k": 2, "seconds": {**plain, "Average": 1.05, "Maximum": 2.0, "ATk": 4.0, "STk": 1.1, "MATk": 1.3}},
        {
            "n": 1000,
            "k": 100,
            "seconds": {**plain, "Average": 1.0, "Maximum": 1.0, "ATk": 4.6, "STk": 1.2, "MATk": 1.2},
        },
    ]
    cpu = {"device": "cpu", "threads": 1, "k": 0.1, "dtype": "float32"}
    text = against_torch.render(stored("topk_against_torch_cpu", {"rows": rows}, cpu, "python -m benchmarks topk"))
    assert "(test machine, 2 cores, 1 torch threads)" in text
    assert "| ATk | `x.topk(k).values.mean()` | ≤ 1.1 | 1.00 | 1.15 |" in text
    assert text.rstrip().splitlines()[-1] == (
        "worst ratio to the plain torch expression: 1.30 (MATk / `x.mean()` at n=16; target 1.2); "
        "every ratio NOT within its target"
    )
    inside = [{**row, "seconds": {**row["seconds"], "MATk": 1.0, "ATk": 4.0}} for row in rows]
    assert against_torch.headline(inside).endswith("every ratio within its target")
    compiled = [{**row, "seconds": {**row["seconds"], "STk compiled": 9.0}} for row in inside]  # --compiled
    text = against_torch.render(stored("topk_against_torch_cuda", {"rows": compiled}, {**cpu, "device": "cuda"}))
    assert "(GPU)" in text
    assert "| STk compiled | `x.mean()` | ≤ 1.2 | 9.00 | 9.00 |" in text and "all n in one process" in text
    assert "control" not in text  # rows measured before the control had none
    paired = {"Average": 1.3, "Maximum": 1.0, "ATk": 1.0, "STk": 1.0, "MATk": 1.0, against_torch.CONTROL: 1.06}
    controlled = [{**row, "ratios": paired} for row in inside]  # a worker's rows: the paired ratios rule
    text = against_torch.render(stored("topk_against_torch_cpu", {"rows": controlled}, cpu))
    assert f"| control: {against_torch.CONTROL} | `x.mean()` | none | 1.06 | 1.06 |" in text
    assert "| Average | `x.mean()` | ≤ 1.1 | 1.30 | 1.30 |" in text
    assert against_torch.headline(controlled).startswith("worst ratio to the plain torch expression: 1.30 (Average")
    assert against_torch.headline(compiled).endswith("every ratio within its target")  # the defaults' headline


def test_the_against_torch_run_writes_its_table(tmp_path):
    out = run("--against-torch", "--sizes", "16", "--rounds", "1", "--against-time", "0.05", "--out-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("worst ratio to the plain torch expression: ")
    assert {p.name for p in tmp_path.iterdir()} == {"topk_against_torch_cpu.json", "topk_against_torch_cpu.md"}
    bad = run("--against-torch", "--k", "1.5", "--out-dir", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "0 < --k <= 1" in bad.stderr and not (tmp_path / "bad").exists()


def test_the_against_torch_options_reach_its_workers(bench_topk, monkeypatch, tmp_path):
    """--against-time, --rounds, --k and --compiled are what each worker gets (--against-time was once
    parsed and then ignored for --min-time); on a CPU one process per n."""
    calls = []

    def fake_run_isolated(target, sizes, k, rounds, seconds, threads, device, compiled, dtype):
        calls.append((target, sizes, k, rounds, seconds, device, compiled, dtype))
        plain = {"x.mean()": 1.0, "x.max()": 1.0, "x.topk(k).values.mean()": 1.0}
        mine = {"Average": 1.0, "Maximum": 1.0, "ATk": 1.0, "STk": 1.0, "MATk": 1.0}
        return [{"n": n, "k": 1, "loops": 1, "seconds": {**plain, **mine}} for n in sizes]

    monkeypatch.setattr(bench_topk, "run_isolated", fake_run_isolated)
    argv = ["--against-torch", "--sizes", "16", "64", "--against-time", "0.7", "--rounds", "3", "--k", "0.25"]
    from benchmarks.harness import main

    main(["topk", *argv, "--compiled", "--dtype", "bfloat16", "--out-dir", str(tmp_path)])
    assert calls == [
        ("benchmarks.against_torch:workers", [16], 0.25, 3, 0.7, "cpu", True, "bfloat16"),
        ("benchmarks.against_torch:workers", [64], 0.25, 3, 0.7, "cpu", True, "bfloat16"),
    ]
    assert (tmp_path / "topk_against_torch_cpu_bfloat16.md").read_text().count("on bfloat16 losses") == 1


def test_the_sweep_is_written_before_the_against_torch_table_runs(bench_topk, monkeypatch, tmp_path):
    """On a CPU one command measures both; a failing against-torch worker leaves the finished sweep written."""
    from benchmarks.harness import WorkerFailed, main

    def fake_sweep_worker(name, points, args, measure_memory):
        return [{"loss": name, "n": n, "k": k, "seconds": 1e-3, "repeats": 3, "peak_bytes": None} for n, k in points]

    def failing(*args):
        raise WorkerFailed("the worker died", 1)

    monkeypatch.setattr(bench_topk, "run_worker", fake_sweep_worker)
    monkeypatch.setattr(bench_topk, "run_isolated", failing)
    with pytest.raises(SystemExit) as exit_:
        main(["topk", "--quick", "--sizes", "16", "--out-dir", str(tmp_path)])
    assert exit_.value.code == 1
    assert {p.name for p in tmp_path.iterdir()} == {"topk_cpu_quick.json", "topk_cpu_quick.md"}
