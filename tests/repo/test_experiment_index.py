"""experiments/INDEX.md is generated from configs/experiment/ and committed as rendered: a new row
missing from it, or a stale description, fails here (`python -m topklab.report index` rewrites it)."""

from helpers import ROOT
from topklab.report.experiments import experiment_rows, render_index


def test_the_committed_index_is_the_rendered_one():
    committed = (ROOT / "experiments" / "INDEX.md").read_text()
    assert committed == render_index(ROOT / "configs"), "run: python -m topklab.report index"


def test_every_row_is_listed_and_shared_parts_are_not(tmp_path):
    rows = {row for group in experiment_rows(ROOT / "configs").values() for row, _ in group}
    on_disk = {
        p.relative_to(ROOT / "configs" / "experiment").with_suffix("").as_posix()
        for p in (ROOT / "configs" / "experiment").rglob("*.yaml")
        if not p.name.startswith("_")
    }
    assert rows == on_disk and not any(row.rsplit("/", 1)[-1].startswith("_") for row in rows)
    (tmp_path / "experiment" / "new").mkdir(parents=True)
    (tmp_path / "experiment" / "new" / "row.yaml").write_text("# @package _global_\n# A new row.\n")
    (tmp_path / "experiment" / "new" / "_common.yaml").write_text("# shared\n")
    assert "| `new/row` | A new row. |" in render_index(tmp_path) and "_common" not in render_index(tmp_path)
