"""A preset that retrains the MATk/STk cells with another λ rule (``full_solve``), against the ``full`` cells."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ttest_rel

from topklab.report import make_result, write_result
from topklab.report.cli import reference_cells
from topklab.report.tabular import against_lines, against_reference, corrected_t_test
from topklab.utils.errors import TopklabError


@settings(max_examples=25, derandomize=True, deadline=None)
@given(
    st.lists(st.floats(-100, 100), min_size=3, max_size=60),
    st.floats(0.1, 3.0),
    st.integers(0, 2**31 - 1),
)
def test_the_corrected_test_is_the_paired_t_test_widened_by_the_split_overlap(ours, ratio, seed):
    """With no test/train term it is scipy's paired t-test; with one, t shrinks by √((1/J) / (1/J + n_test/n_train))."""
    rng = np.random.default_rng(seed)
    other = np.asarray(ours) + rng.normal(0.5, 1.0, len(ours))
    plain_t, plain_p = corrected_t_test(ours, other, 0.0)
    want = ttest_rel(ours, other)
    assert plain_t == pytest.approx(want.statistic, rel=1e-9) and plain_p == pytest.approx(want.pvalue, rel=1e-7)
    t, p = corrected_t_test(ours, other, ratio)
    j = len(ours)
    assert t == pytest.approx(plain_t * math.sqrt((1 / j) / (1 / j + ratio)), rel=1e-9) and p >= plain_p


def test_equal_splits_give_no_difference_and_other_lengths_are_refused():
    assert corrected_t_test([1.0, 2.0], [1.0, 2.0], 0.5) == (0.0, 1.0)
    assert corrected_t_test([2.0, 3.0], [1.0, 2.0], 0.5) == (math.inf, 0.0)
    with pytest.raises(TopklabError, match="the same J >= 2 splits on both sides, got 3 and 2"):
        corrected_t_test([1.0, 2.0, 3.0], [1.0, 2.0], 0.5)


def cell(aggregate, test, split_seed=(0, 1, 2), **diagnostics):
    per_split = {"test": list(test), "split_seed": list(split_seed), **diagnostics}
    payload = {
        "cell": {"table": "table3", "dataset": "d", "individual": "logistic", "aggregate": aggregate},
        "data": {"sizes": [100, 50, 50]},
        "per_split": per_split,
    }
    return {"result": payload}


def test_each_lambda_cell_is_set_against_the_reference_on_the_same_splits_only():
    solved = [cell("stk", [10.0, 12.0, 11.0], hard_share=[0.5, 0.7, 0.6], lam_minus_kth=[0.0, 0.1, -0.1])]
    reference = [
        cell("stk", [11.0, 12.5, 12.0]),
        cell("average", [10.0, 12.0, 11.0]),
        cell("atk", [1, 2, 3], (5, 6, 7)),
    ]
    rows = against_reference("table3", solved, reference)
    assert [r["against"] for r in rows] == ["the paper's update", "Average"]  # ATk's cell ran on other splits
    paper = rows[0]
    t, p = corrected_t_test([10.0, 12.0, 11.0], [11.0, 12.5, 12.0], 0.5)
    assert paper["mean_difference"] == pytest.approx(-2.5 / 3) and (paper["t"], paper["p"]) == (t, p)
    assert paper["hard_share"] == pytest.approx(0.6) and paper["lam_minus_kth"] == pytest.approx(0.0)
    assert rows[1]["t"] == 0.0 and rows[1]["p"] == 1.0
    text = "\n".join(against_lines(rows, 3, "full"))
    assert "| d | logistic | STk | the paper's update | 3 | -0.833 |" in text and "| 0.600 |" in text
    assert against_lines([], 3, "full") == []


def test_only_a_preset_with_another_lambda_rule_is_set_against_the_full_cells(tmp_path):
    payload = {
        **cell("stk", [1.0, 2.0, 3.0])["result"],
        **{"metric": "error_pct", "selected": {}, "test_mean": 2.0, "test_std": 0.8, "combos": {}, "preset": "full"},
    }
    full = [{"result": payload, "config": {"protocol": {}}}]
    write_result(
        tmp_path / "tabular" / "full" / "table3" / "d" / "logistic-stk.json",
        make_result("tabular", "table3/d/logistic/stk", full[0]["result"], "python train.py preset=full", {}, {}),
    )
    solved = [{"result": full[0]["result"], "config": {"protocol": {"lam_update": "solve"}}}]
    paper = [{"result": full[0]["result"], "config": {"protocol": {"lam_update": "gradient"}}}]
    assert len(reference_cells(tmp_path, "full_solve", solved)) == 1
    assert reference_cells(tmp_path, "mine", paper) is None and reference_cells(tmp_path, "full", solved) is None
