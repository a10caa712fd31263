"""scripts/bench_topk.py: one worker measures its points, the report's ratios and headline."""

import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.fixture(scope="module")
def bench_topk():
    from topklab.bench import topk as bench_topk

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
    text = bench_topk.render(rows, "cpu", "test machine", "python scripts/bench_topk.py --quick")
    assert "| STk (native) | 0.1n | 7e+03 ms | 1.4e+03 ms | 1.4e+03 ms |" in text
    assert "| 1e+05 | 9.00 | 2.00 | 1.40 | 0.42, 0.36, 2.73 |" in text
    assert "- STk (native) is faster at: (n=1e5, k=0.9n); (n=1e6, k=0.9n)." in text
    assert text.rstrip().endswith(
        "worst STk/Average ratio (n >= 1e5): 1.40 (STk (native), the path of kernel=auto here; every k)"
    )


def run(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_topk.py"), *args], capture_output=True, text=True, cwd=ROOT
    )


def test_bad_exponents_fail_in_one_line(tmp_path):
    out = run("--min-exp", "5", "--max-exp", "4", "--out-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip() == "error: need 1 <= --min-exp <= --max-exp <= 9, got 5, 4"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_script_writes_the_table_and_ends_with_the_headline(tmp_path):
    out = run("--min-exp", "5", "--max-exp", "5", "--min-time", "0.01", "--out-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("worst STk/Average ratio (n >= 1e5): ")
    assert {p.name for p in tmp_path.iterdir()} == {"topk_cpu.json", "topk_cpu.md", "topk_cpu.png"}
