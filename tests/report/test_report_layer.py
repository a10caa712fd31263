"""The routing and gradient-sparsification tables and plots render from result envelopes, name
the rows still missing, and put each row's numbers where they belong."""

import shutil

from helpers import ROOT
from topklab.report import make_result, write_result
from topklab.report.cli import render_figures, render_layer_tables

PROVENANCE = {"git": {"sha": "abcdef1234", "dirty": False}}


def run_result(
    family: str,
    table: str,
    row: str,
    label: str,
    test: dict,
    val: dict,
    history: list[dict],
    config: dict | None = None,
) -> dict:
    summary = {
        "metrics": {"test": test, "val": val},
        "cost": {"step_time_s": 0.5},
        "train_seconds": 100.0,
        "history": history,
    }
    return make_result(
        family,
        f"{table}/{row}",
        {"table": table, "row": row, "label": label, "summary": summary},
        command="python train.py",
        config=config or {},
        provenance=PROVENANCE,
    )


TOP_K_WITHOUT_PREDICTOR = {"model": {"router": {"_target_": "topklab.models.TopKRouter", "inference": "top_k"}}}


def test_layer_tables_render_rows_benchmarks_and_missing_rows(tmp_path):
    results = tmp_path / "results"
    (tmp_path / "configs" / "experiment" / "routing").mkdir(parents=True)
    for row in ("dense", "top_k_c025", "stk_threshold_c025"):
        (tmp_path / "configs" / "experiment" / "routing" / f"{row}.yaml").write_text("{}\n")
    for row, seed, ppl, routed in (
        ("dense", 0, 30.0, None),
        ("top_k_c025", 0, 33.5, 0.25),
        ("top_k_c025", 1, 34.5, 0.25),
    ):
        write_result(
            results / "routing" / "multi30k_en" / row / f"seed{seed}.json",
            run_result(
                "language_modeling",
                "multi30k_en",
                row,
                row,
                {"perplexity": ppl, "routed_fraction": routed, "routed_fraction_per_layer": routed and [0.2, 0.3]},
                {"perplexity": ppl + 1},
                [{"train_routed_fraction_layer1": 0.25, "train_routed_fraction_layer3": 0.26}],
                TOP_K_WITHOUT_PREDICTOR if row.startswith("top_k") else None,
            ),
        )
    write_result(
        results / "sparsification" / "fmnistlt" / "exact_topk_1pct" / "seed0.json",
        run_result(
            "vision",
            "fmnistlt",
            "exact_topk_1pct",
            "exact top-k, 1 %",
            {"top1": 41.5, "top5": 85.0},
            {"top1": 43.0},
            [{"sent_fraction": 0.01, "selection_s": 0.004}] * 2,
        ),
    )
    bench = {
        "rows": [
            {
                "n": 1000,
                "ratio": 0.01,
                "k": 10,
                "selector": s,
                "seconds": t,
                "vs_topk": t / 0.002,
                "count_over_k": 1.0,
                "recall": 1.0,
            }
            for s, t in (("exact top-k", 0.002), ("STk threshold, warm", 0.003))
        ],
        "device": "cpu",
        "threads": 1,
        "repeats": 3,
    }
    write_result(
        results / "bench" / "sparsification_cpu.json",
        make_result(
            "bench",
            "sparsification_cpu",
            bench,
            command="python -m benchmarks sparsification",
            config={},
            provenance=PROVENANCE,
        ),
    )
    tables = render_layer_tables(results)
    routing = tables["routing.md"]
    assert "Missing rows: `routing/stk_threshold_c025`." in routing and "abcdef1 (clean tree)." in routing
    top_k_line = next(line for line in routing.splitlines() if line.startswith("| top_k_c025"))
    assert (
        "| no | 0.250 | 0.250 / 0.260 | 0.200 / 0.300 | — | 35.00 | 34.00 ± 0.71 (n = 2: 33.50, 34.50) | 4.00 |"
        in top_k_line
    )
    assert "Step-time benchmark missing" in routing
    sparsification = tables["gradient_sparsification.md"]
    assert "| exact top-k, 1 % | 1.000 | 4.00 | 43.00 | 41.50 | 85.00 | 100 |" in sparsification
    assert "| 1,000 | 1.0% | STk threshold, warm | 3.00 | 1.50 |" in sparsification
    shutil.copytree(ROOT / "results" / "paper", results / "paper")
    written = render_figures(results, tmp_path / "figures")
    assert {"routing.png", "gradient_sparsification.png"} <= set(written)
    assert (tmp_path / "figures" / "routing.png").stat().st_size > 1000


def test_the_routing_table_shows_the_worst_seed_and_marks_a_row_that_did_not_hold_capacity(tmp_path):
    results = tmp_path / "results"
    for row, seed, shares in (
        ("stk_threshold_c025", 0, [0.24, 0.26]),
        ("stk_threshold_c025", 1, [0.25, 0.27]),
        ("stk_threshold_c0125", 0, [0.12, 0.13]),
        ("stk_threshold_c0125", 1, [0.17, 0.098]),
    ):
        capacity = 0.25 if row.endswith("c025") else 0.125
        write_result(
            results / "routing" / "multi30k_en" / row / f"seed{seed}.json",
            run_result(
                "language_modeling",
                "multi30k_en",
                row,
                f"STk threshold, c = {capacity}",
                {"perplexity": 40.0, "routed_fraction": sum(shares) / 2, "routed_fraction_per_layer": shares},
                {"perplexity": 41.0},
                [],
                {"seed": seed, "model": {"layers": 4, "router": {"capacity": capacity}}},
            ),
        )
    routing = render_layer_tables(results)["routing.md"]
    lines = {line.split(" | ")[0]: line for line in routing.splitlines() if line.startswith("| STk")}
    assert "| 0.270 (seed 1, layer 3) |" in lines["| STk threshold, c = 0.25"]  # within [0.2, 0.3]: no mark
    assert "| 0.170 (seed 1, layer 1) |" in lines["| STk threshold, c = 0.125 ‡"]
    assert routing.count("‡") == 3  # the header's legend, the row and its footnote
    assert (
        "‡ Capacity not held: these seeds' routed layers processed a share of the test tokens outside [0.8c, 1.2c]: "
        "STk threshold, c = 0.125: seed 1 layer 1 0.170, seed 1 layer 3 0.098." in routing
    )


def test_sampled_threshold_rows_are_named_for_the_rule_their_selector_ran(tmp_path):
    results = tmp_path / "results"
    for row, adaptation, stored in (
        ("sampled_threshold_1pct", "bracketed", "sampled threshold (DGC's rule), 1 %"),
        ("sampled_threshold_dgc_1pct", "dgc", "sampled threshold, DGC's ×1.3 / ×0.8 rule, 1 %"),
    ):
        write_result(
            results / "sparsification" / "fmnistlt" / row / "seed0.json",
            run_result(
                "vision",
                "fmnistlt",
                row,
                stored,
                {"top1": 41.5, "top5": 85.0},
                {"top1": 43.0},
                [{"sent_fraction": 0.01, "selection_s": 0.004}],
                {"engine": {"gradient_exchange": {"selector": {"adaptation": adaptation}}}},
            ),
        )
    table = render_layer_tables(results)["gradient_sparsification.md"]
    assert "| sampled threshold, bracketed to k (exact top-k in effect), 1 % | 1.000 |" in table
    assert "| sampled threshold, DGC's ×1.3 / ×0.8 rule, 1 % | 1.000 |" in table
    assert "(DGC's rule)" not in table
