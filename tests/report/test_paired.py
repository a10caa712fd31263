"""Paired differences from a table's baseline (topklab.report.paired): the t-interval, the pairing, the
table under a vision table, the k sweep with its missing rows and seeds, the figure, and a superseded
table's header. The fixture runs carry the fmnistlt_full pilot's test top-1 (docs/evidence.md)."""

import pytest

from helpers import CONFIG_DIR, ROOT
from helpers.tables import fake_vision_run
from topklab.report.paired import paired, sweep_points, t_interval, t_quantile, table_groups
from topklab.report.schema import read_results
from topklab.report.vision import render_vision
from topklab.utils.errors import TopklabError

PILOT = {  # test top-1 of seeds 0-4, fmnistlt_full pilot at k/n = 0.9
    "la": ("LA", [84.36, 83.36, 83.41, 84.26, 83.36]),
    "la_stk": ("LA + STk, k/n = 0.90", [84.25, 83.24, 83.94, 84.40, 83.67]),
}
STEADY = [1.2, 0.8, 0.6, 0.5]


def pilot_tree(tmp_path, rows=PILOT):
    """``tmp_path/results/vision/fmnistlt_full/<row>/seed<k>.json`` with the pilot's values, the STk runs
    in band on every step; ``tmp_path/configs`` is the repository's."""
    (tmp_path / "configs").symlink_to(CONFIG_DIR)
    results = tmp_path / "results"
    for row, (label, values) in rows.items():
        for seed, top1 in enumerate(values):
            tracking = {"in_band": 1.0, "flag": None} if "stk" in row else None
            fake_vision_run(
                results, "fmnistlt_full", row, label, seed, top1, 99.0, [80.0, 60.0, 40.0], STEADY, tracking
            )
    return results


# two-sided 95 % quantiles of Student's t (any statistics table)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 20: 2.086, 30: 2.042}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_the_table(df):
    assert t_quantile(df) == pytest.approx(T_TABLE[df], abs=5e-4)


def test_the_interval_is_mean_plus_minus_t_sd_over_root_n():
    mean, half = t_interval([-0.11, -0.12, 0.53, 0.14, 0.31])
    assert mean == pytest.approx(0.15)
    assert half == pytest.approx(2.776445 * 0.278657 / 5**0.5, rel=1e-4)  # sample sd 0.2787
    assert t_interval([2.0]) == (2.0, None)


def test_pairs_keep_shared_seeds_and_leave_a_diverged_run_out(tmp_path):
    for seed, top1 in enumerate([80.0, 81.0, 82.0]):
        fake_vision_run(tmp_path, "t", "la", "LA", seed, top1, 99.0, [1.0, 1.0, 1.0], STEADY)
    fake_vision_run(tmp_path, "t", "stk", "STk", 0, 81.0, 99.0, [1.0, 1.0, 1.0], STEADY)
    fake_vision_run(tmp_path, "t", "stk", "STk", 1, 30.0, 99.0, [1.0, 1.0, 1.0], [1.2, 0.6, 2.0])  # diverged
    fake_vision_run(tmp_path, "t", "stk", "STk", 5, 85.0, 99.0, [1.0, 1.0, 1.0], STEADY)  # LA has no seed 5
    runs = {r["result"]["row"]: [] for r in read_results(tmp_path / "vision", "vision")}
    for r in read_results(tmp_path / "vision", "vision"):
        runs[r["result"]["row"]].append(r)
    top1 = lambda r: r["result"]["summary"]["selection"]["top1"]["test"]  # noqa: E731
    assert paired(runs["la"], runs["stk"], top1) == [(0, 1.0)]


def test_the_group_declares_baseline_seeds_and_successor_in_its_result_block():
    groups = table_groups(CONFIG_DIR, "vision")
    assert groups["fmnistlt_full"]["baseline"] == "la" and groups["fmnistlt_full"]["seeds"] == 5
    assert groups["fmnistlt_full"]["rows"]["la_stk_k50"] == {"label": "LA + STk, k/n = 0.50", "loss": "stk", "k": 0.5}
    assert groups["fmnistlt"]["superseded_by"] == "fmnistlt_full"
    assert "fmnistlt" in table_groups(CONFIG_DIR, "sparsification")  # another folder's table of that name


def test_the_table_pairs_each_row_with_the_baseline_and_lists_what_is_missing(tmp_path):
    results = pilot_tree(tmp_path)
    rendered = render_vision(read_results(results / "vision", "vision"), [], tmp_path / "configs")
    assert sorted(rendered) == [
        "fmnistlt_controls_k.md",
        "fmnistlt_full.md",
        "fmnistlt_full_k.md",
    ]  # a sweep before runs
    main = rendered["fmnistlt_full.md"]
    assert "`la_stk_k50` (seeds 0, 1, 2, 3, 4)" in main.split("\n\n")[1]  # in the header
    assert (
        "| LA + STk, k/n = 0.90 | 5 | +0.15 | [−0.20, +0.50] | 0.35 | −0.11 (seed 0), −0.12 (seed 1), "
        "+0.53 (seed 2), +0.14 (seed 3), +0.31 (seed 4) |"
    ) in main
    assert main.index("Paired by seed") < main.index("Top-1 (%) per seed")  # under the main table
    sweep = rendered["fmnistlt_full_k.md"]
    assert "**Still missing** (5 seeds per row" in sweep and "`la_atk` (seeds 0, 1, 2, 3, 4)" in sweep
    assert "`la_stk` (" not in sweep and "`la` (" not in sweep
    assert "| LA + STk | 0.9 | `la_stk` | 5 | +0.15 | [−0.20, +0.50] | 0.35 |" in sweep
    assert "(seed 4) | 1.00 ± 0.00 |" in sweep  # λ in band over the STk row's seeds
    assert "| LA + ATk | 0.5 | `la_atk_k50` | 0 | not run | — | — | — | — | — |" in sweep
    controls = rendered["fmnistlt_controls_k.md"]
    assert "| LA + STk (ATk's scale) | 0.7 | `la_stk_k70_scale_atk` | 0 | not run |" in controls  # a series of its own
    assert [line.split(" | ")[1] for line in sweep.splitlines() if line.startswith("| LA + STk |")] == [
        "0.5",
        "0.7",
        "0.9",
        "0.96",
    ]


def test_a_seed_the_baseline_lacks_is_missing_and_left_unpaired(tmp_path):
    results = pilot_tree(tmp_path, {"la": ("LA", PILOT["la"][1][:3]), "la_stk": PILOT["la_stk"]})
    rendered = render_vision(read_results(results / "vision", "vision"), [], tmp_path / "configs")
    assert "`la` (seeds 3, 4)" in rendered["fmnistlt_full_k.md"]
    assert "| LA + STk | 0.9 | `la_stk` | 3 | +0.10 |" in rendered["fmnistlt_full_k.md"]


def test_the_sweep_table_renders_before_any_run(tmp_path):
    (tmp_path / "configs").symlink_to(CONFIG_DIR)
    sweep = render_vision([], [], tmp_path / "configs")["fmnistlt_full_k.md"]
    points = sweep_points(table_groups(CONFIG_DIR, "vision")["fmnistlt_full"], {}, None)
    assert "`la` (seeds 0, 1, 2, 3, 4)" in sweep and sweep.count("not run") == sum(map(len, points.values())) == 8


def test_the_superseded_table_says_so_in_its_header():
    committed = (ROOT / "results" / "tables" / "fmnistlt.md").read_text().split("\n\n")
    assert committed[1].startswith("**Superseded by `fmnistlt_full`** (docs/evidence.md)")


def test_the_k_figure_is_drawn_from_the_results_and_skipped_without_them(tmp_path):
    import matplotlib.image as image

    from topklab.report.cli import render_charts

    results = pilot_tree(tmp_path)
    assert "k_sweep_fmnistlt_full.png" in render_charts(results, tmp_path / "figures")
    assert image.imread(tmp_path / "figures" / "k_sweep_fmnistlt_full.png").shape[:2] == (504, 780)
    (tmp_path / "empty" / "results").mkdir(parents=True)
    (tmp_path / "empty" / "configs").symlink_to(CONFIG_DIR)
    assert render_charts(tmp_path / "empty" / "results", tmp_path / "empty" / "figures") == []


def test_the_hard_share_stands_beside_the_band_and_a_lambda_below_every_loss_is_named(tmp_path):
    """Runs whose λ sat below every loss (hard share 1) on every seed are named under the table; a row with one
    seed below 1 is not; the hard share is a column of both tables."""
    (tmp_path / "configs").symlink_to(CONFIG_DIR)
    results = tmp_path / "results"
    shares = {"la_stk": [1.0, 1.0], "la_stk_k50": [1.0, 0.99]}
    for row, label in (("la", "LA"), ("la_stk", "LA + STk, k/n = 0.90"), ("la_stk_k50", "LA + STk, k/n = 0.50")):
        for seed in range(2):
            tracking = {"in_band": 1.0, "flag": None, "hard_share": shares[row][seed]} if row in shares else None
            fake_vision_run(results, "fmnistlt_full", row, label, seed, 80.0 + seed, 99.0, [80, 60, 40], None, tracking)
    rendered = render_vision(read_results(results / "vision", "vision"), [], tmp_path / "configs")
    main, sweep = rendered["fmnistlt_full.md"], rendered["fmnistlt_full_k.md"]
    note = next(line for line in main.splitlines() if line.startswith("**λ below every loss**"))
    assert "LA + STk, k/n = 0.90." in note and "0.50" not in note
    assert "| 1.00 ± 0.00 | 1.000 ± 0.000 |" in main and "| 1.00 ± 0.00 | 0.995 ± 0.005 |" in main
    assert "| LA + STk | 0.9 | `la_stk` | 2 |" in sweep and sweep.count("| 1.000 ± 0.000 |") == 1


def test_a_control_is_paired_with_the_rows_it_controls(tmp_path):
    """fmnistlt_controls' ``_controls.yaml``: STk at ATk's scale against ATk at the same k, seed by seed."""
    (tmp_path / "configs").symlink_to(CONFIG_DIR)
    results = tmp_path / "results"
    top1 = {"la": [80.0, 81.0], "la_atk_k50": [82.0, 83.0], "la_stk_k50_scale_atk": [81.5, 83.5]}
    labels = {
        "la": "LA",
        "la_atk_k50": "LA + ATk, k/n = 0.50",
        "la_stk_k50_scale_atk": "LA + STk (ATk's scale), k/n = 0.50",
    }
    for row, values in top1.items():
        for seed, value in enumerate(values):
            fake_vision_run(results, "fmnistlt_controls", row, labels[row], seed, value, 99.0, [80, 60, 40])
    main = render_vision(read_results(results / "vision", "vision"), [], tmp_path / "configs")["fmnistlt_controls.md"]
    section = main[main.index("Controls, paired by seed") :]
    assert (
        "| LA + STk (ATk's scale), k/n = 0.50 | LA + ATk, k/n = 0.50 | 2 | +0.00 | [−6.35, +6.35] | 6.35 | "
        "−0.50 (seed 0), +0.50 (seed 1) |"
    ) in section
    assert "| LA + STk (ATk's scale), k/n = 0.50 | LA + STk, k/n = 0.50 |" not in section  # no runs of that row


def test_controls_naming_a_row_the_group_lacks_are_one_line_errors(tmp_path):
    group = tmp_path / "experiment" / "g"
    group.mkdir(parents=True)
    (group / "_common.yaml").write_text("result: {family: vision, table: g, baseline: a, seeds: 2}\n")
    (group / "a.yaml").write_text('row: "A"\n')
    (group / "_controls.yaml").write_text("a: [b]\n")
    with pytest.raises(TopklabError, match=r"_controls.yaml names rows its group lacks: b$"):
        table_groups(tmp_path, "vision")
