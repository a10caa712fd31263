"""`make tables TABLE=<name>` (``python -m topklab.report tables --table <name>``) renders that table alone:
its files only, byte for byte what the full rendering writes (the committed ones), without rendering
the other tables; an unknown name is a one-line error listing the names, and nothing is written."""

import shutil
import subprocess

import pytest

from helpers import ROOT
from topklab.report import cli

RESULTS = ROOT / "results"
TABLES = RESULTS / "tables"


def test_one_vision_table_is_rendered_alone_byte_for_byte(tmp_path, monkeypatch):
    def no_tabular(*args, **kwargs):
        raise AssertionError("rendering one vision table rendered Tables 3, 4, 6")

    monkeypatch.setattr(cli, "render_tabular", no_tabular)
    assert cli.tables(["--results", str(RESULTS), "--out", str(tmp_path), "--table", "fmnistlt_full"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fmnistlt_full.md"]
    assert (tmp_path / "fmnistlt_full.md").read_bytes() == (TABLES / "fmnistlt_full.md").read_bytes()


def test_a_tabular_table_writes_its_markdown_and_latex_and_no_other_table(tmp_path):
    assert cli.tables(["--results", str(RESULTS), "--out", str(tmp_path), "--table", "table6_quick.md"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table6_quick.md", "table6_quick.tex"]
    for name in ("table6_quick.md", "table6_quick.tex"):
        assert (tmp_path / name).read_bytes() == (TABLES / name).read_bytes(), name


def test_an_unknown_table_is_a_one_line_error_listing_the_names(tmp_path, capsys):
    assert cli.tables(["--results", str(RESULTS), "--out", str(tmp_path), "--table", "fmnistlt_ful"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: no table 'fmnistlt_ful'")
    assert "fmnistlt_full, fmnistlt_full_k" in err and "table3, " in err
    assert not list(tmp_path.iterdir())


def test_the_names_are_the_committed_tables():
    """Every committed table has a name to render it by, and every name a committed table."""
    assert set(cli.table_renderers(RESULTS)) == {p.stem for p in TABLES.iterdir() if p.suffix in (".md", ".tex")}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_passes_table_to_the_renderer():
    def planned(*args):
        done = subprocess.run(["make", "-n", "-o", "setup", "tables", *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "scripts/make_tables.py" in planned() and "--table" not in planned()
    assert "--table fmnistlt_full" in planned("TABLE=fmnistlt_full")
