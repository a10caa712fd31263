"""scripts/lambda_band.py's counts: computed from the rows, and the committed page holds what they give."""

import json

from helpers import ROOT, load_script


def test_the_counts_split_k_equal_n_partly_and_not_tracked():
    script = load_script("lambda_band")
    rows = [{"in_band": v} for v in (None, 0.95, 0.9, 0.7, 0.5, 0.2)]
    assert script.counts(rows, "cells") == (
        "cells: 6, 1 at k = n (Average by definition); over the 5 with k < n, λ in band min 0.200, median 0.700, "
        "max 0.950: 2 at ≥ 0.9, 2 partly (0.5–0.9), 1 below 0.5."
    )


def test_the_committed_band_page_is_rendered_from_its_rows():
    script = load_script("lambda_band")
    stored = json.loads((ROOT / "results" / "bench" / "lambda_band_cpu.json").read_text())
    page = (ROOT / "results" / "bench" / "lambda_band_cpu.md").read_text()
    assert page == script.render(stored["result"]["rows"], stored["command"])


def test_the_readme_counts_the_marked_cells_from_the_band_rows():
    stored = json.loads((ROOT / "results" / "bench" / "lambda_band_cpu.json").read_text())
    shares = [r["in_band"] for r in stored["result"]["rows"] if r["family"] == "tabular" and r["in_band"] is not None]
    marked, not_stk = sum(v < 0.9 for v in shares), sum(v < 0.5 for v in shares)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"mark with † the {marked} MATk/STk cells" in readme and f"({not_stk} of them below half" in readme
    tables = "".join((ROOT / "results" / "tables" / f"table{t}.md").read_text() for t in (3, 4, 6))
    assert tables.count(" † |") == marked


def test_the_readme_counts_table_2s_marked_columns_from_the_band_rows():
    stored = json.loads((ROOT / "results" / "bench" / "lambda_band_cpu.json").read_text())
    shares = {
        r["row"].removeprefix("table2: "): r["in_band"]
        for r in stored["result"]["rows"]
        if r["family"] == "synthetic" and r["in_band"] is not None
    }
    marked = [name for name, v in shares.items() if v < 0.9]
    not_stk = [name for name, v in shares.items() if v < 0.5]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"Table 2 its {len(marked)} such columns ({len(not_stk)} of them below half: {', '.join(not_stk)})" in readme
    header = (ROOT / "results" / "tables" / "table2.md").read_text().split("\n| | ", 1)[1].split("\n", 1)[0]
    assert [c.removesuffix(" †") for c in header.rstrip(" |").split(" | ") if c.endswith(" †")] == marked
