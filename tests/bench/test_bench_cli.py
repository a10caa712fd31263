"""``python -m benchmarks``: the harness lists every benchmark module and runs each tiny configuration."""

import ast
import json
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from benchmarks.harness import benchmarks, main
from helpers import ROOT
from topklab.utils.errors import TopklabError


def test_help_lists_every_benchmark():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    names = set(benchmarks())
    assert names == {
        *("cifar_epoch", "embeddings", "loader", "operators", "peft", "population"),
        *("routing", "sparsification", "step_share", "topk", "tracked_cuda", "triton_compile", "triton_host"),
    }
    assert all(f"    {name}" in done.stdout for name in names)


def _slow(function: ast.FunctionDef) -> bool:
    return any("slow" in ast.unparse(decorator) for decorator in function.decorator_list)


def benchmarks_run_by_default_tests() -> set[str]:
    """The benchmarks that a test outside the slow tier runs through the harness (``main(["<name>", …])``)."""
    run = set()
    for path in (ROOT / "tests" / "bench").glob("test_*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef) or not function.name.startswith("test_") or _slow(function):
                continue
            for call in ast.walk(function):
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func) == "main"
                    and call.args
                    and isinstance(call.args[0], ast.List)
                    and call.args[0].elts
                    and isinstance(call.args[0].elts[0], ast.Constant)
                ):
                    run.add(call.args[0].elts[0].value)
    return run


def test_every_benchmark_runs_in_the_default_tier():
    """Each benchmark's command line runs end to end in some test that ``make test`` runs (a GPU
    benchmark on a machine without one: its one-line refusal)."""
    assert set(benchmarks()) - benchmarks_run_by_default_tests() == set()


def test_the_package_holds_no_benchmark():
    from setuptools import find_packages

    assert not [name for name in find_packages(ROOT / "src") if "bench" in name]
    assert not (ROOT / "src" / "topklab" / "bench").exists()


def test_the_loader_benchmark_writes_its_table(tmp_path):
    args = ["--images", "128", "--batch-size", "64", "--workers", "0", "--threads", "1"]
    assert main(["loader", *args, "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "loader_cpu.json").read_text())
    assert result["command"] == "python -m benchmarks loader " + " ".join([*args, "--out-dir", str(tmp_path)])
    assert (tmp_path / "loader_cpu.md").read_text().count("Produced by: `python -m benchmarks loader") == 1


def test_the_tracked_benchmark_refuses_a_missing_gpu_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["tracked_cuda", "--sizes", "1000"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_graphed_table_says_it_replays_and_where_a_refused_capture_stopped_it():
    from benchmarks.tracked_cuda import render

    rows = [
        {"dtype": "float32", "n": 1000, "k": "5", "us": {"x.mean()": 10.0, "STk (track, triton)": 12.0},
         "ratio": {"x.mean()": 1.0, "STk (track, triton)": 1.2}},
    ]  # fmt: skip
    stopped = "float32, n = 1e+04, k = 5: ATk (topk): operation not permitted when stream is capturing"
    result = {
        "result": {"meta": {"device": "a GPU", "torch": "2", "stopped": stopped}, "rows": rows},
        "config": {"rules": ["track"], "rounds": 7, "graphed": True},
        "command": "python -m benchmarks tracked_cuda --graphed",
    }
    table = render(result)
    assert "replayed from a CUDA graph" in table
    assert "| float32 | 1e+03 | 5 | 1.00 | 1.20 | 10.0 |" in table
    assert table.rstrip().endswith(f"a capture was refused at {stopped}.")


def test_a_refused_capture_names_its_first_cause_and_stops_the_run_keeping_its_rows(monkeypatch):
    """A broken capture raises again when it ends; the first error (its context) is the one named, and
    the graphed run keeps the rows measured before it and says where it stopped."""
    import contextlib
    from argparse import Namespace

    from benchmarks import tracked_cuda

    @contextlib.contextmanager
    def ending_badly(graph):
        try:
            yield
        finally:
            raise RuntimeError("operation failed due to a previous error during capture")

    capturing = []

    def call(x):
        if capturing:
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(torch.cuda, "Stream", lambda: mock.Mock())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: mock.Mock())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: capturing.append(1))
    monkeypatch.setattr(torch.cuda, "graph", ending_badly)
    with pytest.raises(
        tracked_cuda.NotCaptured, match=r"^ATk \(topk\): operation not permitted when stream is capturing$"
    ):
        tracked_cuda.captured("ATk (topk)", call, torch.rand(3, requires_grad=True))

    done = {"dtype": "float32", "n": 1000, "k": "5", "us": {"x.mean()": 1.0}, "ratio": {"x.mean()": 1.0}}
    outcomes = iter([done, tracked_cuda.NotCaptured("ATk (topk): a host read")])

    def measured_row(*args):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(tracked_cuda, "measured_row", measured_row)
    monkeypatch.setattr(tracked_cuda, "bench_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "a GPU")
    args = Namespace(
        dtype=["float32"], sizes=[1e3, 1e4, 1e5], ks=["5"], rules=["track"], rounds=1, graphed=True, out="."
    )
    measured = tracked_cuda.measure(args)
    assert measured.stem == "tracked_cuda_graphed" and measured.payload["rows"] == [done]
    assert measured.payload["meta"]["stopped"] == "float32, n = 1e+04, k = 5: ATk (topk): a host read"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_graphed_benchmark_captures_every_call_on_cuda(tmp_path):
    args = ["--sizes", "1000", "100000", "--ks", "5", "0.5", "--rounds", "1", "--rules", "track", "solve"]
    assert main(["tracked_cuda", *args, "--graphed", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "tracked_cuda_graphed.json").read_text())["result"]
    assert result["meta"]["stopped"] is None and len(result["rows"]) == 4
    assert all(len(row["us"]) == 6 for row in result["rows"]), result["rows"]


def test_the_host_benchmark_times_the_triton_path_with_its_launches_stubbed(tmp_path):
    args = ["--sizes", "200", "--calls", "20", "--rounds", "2", "--rules", "track", "solve"]
    assert main(["triton_host", *args, "--out-dir", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "triton_host_cpu.json").read_text())["result"]["rows"]
    assert row["ratio"]["x.mean()"] == 1 and all(value > 0 for value in row["us"].values())
    # forward + backward: one launch each, so no candidate fell back to the torch path
    assert row["launches"] == {"x.mean()": 0, "STk (track)": 2, "MATk (track)": 2, "STk (solve)": 2, "MATk (solve)": 2}
    table = (tmp_path / "triton_host_cpu.md").read_text()
    assert "| 200 | 20 | " in table and "STk (track) 2, MATk (track) 2" in table


def test_the_host_benchmark_keeps_tritons_launch_path_where_triton_jits(tmp_path):
    """Triton's own launch path (a stand-in driver, the C launcher a counted no-op) needs its JIT, so this
    runs in a process without the interpreter the test run sets."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    args = ["--sizes", "200", "--calls", "20", "--rounds", "2", "--rules", "track", "--launcher"]
    command = [sys.executable, "-m", "benchmarks", "triton_host", *args, "--out-dir", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    (row,) = json.loads((tmp_path / "triton_host_launcher_cpu.json").read_text())["result"]["rows"]
    assert row["launches"] == {"x.mean()": 0, "STk (track)": 2, "MATk (track)": 2}
    assert "Triton's launch path kept" in (tmp_path / "triton_host_launcher_cpu.md").read_text()


def test_the_host_benchmark_refuses_the_launch_path_under_the_interpreter_in_one_line(capsys, tmp_path):
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set for the test run (tests/conftest.py)
    assert main(["triton_host", "--sizes", "50", "--launcher", "--out-dir", str(tmp_path)]) == 2
    assert "unset TRITON_INTERPRET" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_the_population_benchmark_runs_a_small_population(capsys, tmp_path):
    args = ["--members", "24", "--loop-members", "2", "--splits", "1", "--epochs", "1", "--preset", "quick"]
    assert main(["population", *args, "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "population_australian_cpu.json").read_text())["result"]
    assert [p["members"] for p in result["phases"]] == [2, 24, 24]
    assert printed.strip().splitlines()[-1] == f"speedup: {result['speedup']:.1f}"
    table = (tmp_path / "population_australian_cpu.md").read_text()
    assert "| population (grouped) | 24 |" in table and table.rstrip().endswith(f"{result['speedup']:.1f}")


def test_a_stored_result_is_drawn_again_from_the_file_alone(tmp_path, capsys):
    args = ["--images", "128", "--batch-size", "64", "--workers", "0", "--threads", "1", "--out-dir", str(tmp_path)]
    assert main(["loader", *args]) == 0
    table = (tmp_path / "loader_cpu.md").read_text()
    (tmp_path / "loader_cpu.md").unlink()
    assert main(["render", str(tmp_path / "loader_cpu.json")]) == 0
    assert (tmp_path / "loader_cpu.md").read_text() == table


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("results/bench/table1.json", "is not a `python -m benchmarks <name>` command"),
        ("results/bench/no_such.json", "does not exist"),
    ],
)
def test_drawing_what_no_benchmark_wrote_is_one_line(path, message, capsys):
    assert main(["render", str(ROOT / path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_only_the_harness_writes_files():
    """A benchmark returns what it measured and the harness writes it (benchmarks/harness/output.py): no
    benchmark module calls a result writer (its ``plot`` draws to the path the harness gives it)."""
    writers = ("write_outputs(", "write_result(", "make_result(", "atomic_write_text(", '.with_suffix(".md")')
    found = [
        f"{path.name}: {writer}"
        for path in (ROOT / "benchmarks").glob("*.py")
        for writer in writers
        if writer in path.read_text()
    ]
    assert found == []


def committed_benchmark_results() -> list:
    """The committed results/bench/*.json that a benchmark wrote and whose table is committed beside them."""
    from benchmarks.harness.output import benchmark_of

    found = []
    for path in sorted((ROOT / "results" / "bench").glob("*.json")):
        try:
            benchmark_of(json.loads(path.read_text()))
        except TopklabError:  # a script's result (table1, thread_probe, …): not drawn by a benchmark
            continue
        if path.with_suffix(".md").exists():
            found.append(path)
    return found


@pytest.mark.parametrize("path", committed_benchmark_results(), ids=lambda path: path.stem)
def test_every_committed_benchmark_table_is_drawn_from_its_result_file(path, tmp_path, capsys):
    """The committed table is what the benchmark's renderer draws from the committed result alone."""
    copy = tmp_path / path.name
    copy.write_text(path.read_text())
    assert main(["render", str(copy)]) == 0
    assert copy.with_suffix(".md").read_text() == path.with_suffix(".md").read_text()
