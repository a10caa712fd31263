"""The pages and files a reader meets say what is true now: no tracked file's prose, comments or path
names date things by numbered working periods or work items (a word for one of them, then a number,
also across a line break), nor speak of a working period at all (pytest's fixture scope and
``start_new_session`` pass); no page names a commit (a result's file records
its own; the README names the one its test time was measured at); every page under docs/ fits
in 150 lines; docs/layout.md gives every top-level folder and every package of src/topklab its line."""

import re
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

DOCS = ROOT / "docs"
SELF = Path(__file__).resolve()  # holds the examples the pattern must catch
MAX_PAGE_LINES = 150

PERIOD, ITEM = "session", "issue"  # the words for a working period and a work item
# one of them, then a number, in any case, after a word boundary or an underscore (as in a folder name)
NUMBERED = re.compile(rf"(?i)(?:\b|_)(?:{PERIOD}s?|{ITEM}s?)[\s_#-]*\d")
# the word for a working period anywhere, but as pytest's fixture scope or subprocess's start_new_session
PERIOD_WORD = re.compile(rf'(?i)(?<!scope=")(?<![\w])(?<!scope=\'){PERIOD}s?\b')
# Data, logs and recorded results keep what the machine wrote; prose, code and configs are checked.
DATA_SUFFIXES = {".json", ".jsonl", ".log", ".txt", ".csv", ".tsv", ".npz", ".npy", ".pt", ".png", ".pdf", ".gz"}


def tracked_files() -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in done.stdout.decode().split("\0") if name]


def test_no_path_names_a_numbered_working_period():
    named = [name for name in tracked_files() if NUMBERED.search(name)]
    assert not named, f"rename these by date and machine (or by what they hold): {named}"


def test_no_prose_or_comment_names_a_numbered_working_period():
    found = []
    for name in tracked_files():
        path = ROOT / name
        if path.suffix in DATA_SUFFIXES or not path.is_file() or path == SELF:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
            for pattern in (NUMBERED, PERIOD_WORD)
            for match in pattern.finditer(text)
        ]
    assert not found, "say what is true now (what changed when goes to CHANGELOG.md by date):\n" + "\n".join(found)


# 7 to 40 hex digits with a digit and a letter, standing alone (not inside a file name such as
# ig_resnext101_32x48-3e41cc8a.pth or a longer word)
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.-])")


def commits_named(text: str) -> list[str]:
    return COMMIT.findall(text)


def test_the_commit_pattern_finds_a_commit_and_leaves_file_names_and_numbers():
    assert commits_named("measured at clean 26f9be1, one thread; (b964074)") == ["26f9be1", "b964074"]
    assert commits_named("ig_resnext101_32x48-3e41cc8a.pth, 1000000 rows, deadbeef, a 7-digit 1234567") == []


def test_no_page_names_a_commit():
    named = {
        page.name: commits_named(page.read_text())
        for page in sorted(DOCS.rglob("*.md"))
        if commits_named(page.read_text())
    }
    assert not named, f"cite the result file (its envelope records the commit) instead: {named}"
    assert len(commits_named((ROOT / "README.md").read_text())) <= 1  # the commit the test time was measured at


def test_the_pattern_tells_a_numbered_period_from_pytest_scope():
    numbered_ones = (
        f"{PERIOD} 23",
        f"{PERIOD.title()} 28's machine",
        f"h200_2026-11-26_{PERIOD}23",
        f"{ITEM} 31 item 2",
        f"as in {PERIOD}s\n  23 and 27",
    )
    for numbered in (*numbered_ones, f"{ITEM}s 28"):
        assert NUMBERED.search(numbered), numbered
    for fine in (f'@pytest.fixture(scope="{PERIOD}")', f"a {PERIOD}'s device time", f"the {ITEM}s of a loss"):
        assert not NUMBERED.search(fine), fine


def test_the_word_for_a_working_period_is_caught_but_in_pytest_and_subprocess_arguments():
    for said in (f"the {PERIOD} started from", f"earlier {PERIOD}s' runs", f"{PERIOD.title()} notes"):
        assert PERIOD_WORD.search(said), said
    for fine in (f'@pytest.fixture(scope="{PERIOD}")', f"start_new_{PERIOD}=True", f"scope='{PERIOD}'"):
        assert not PERIOD_WORD.search(fine), fine


def test_every_page_fits_in_150_lines():
    long = {
        str(p.relative_to(DOCS)): n
        for p in sorted(DOCS.rglob("*.md"))
        if (n := len(p.read_text().splitlines())) > MAX_PAGE_LINES
    }
    assert not long, f"split these pages into sub-pages of at most {MAX_PAGE_LINES} lines: {long}"


def layout_block() -> str:
    text = (DOCS / "layout.md").read_text(encoding="utf-8")
    return text.split("```\n", 2)[1]  # the page's first block: the tree


def test_every_top_level_folder_has_its_line_in_the_layout():
    folders = sorted({name.split("/", 1)[0] for name in tracked_files() if "/" in name})
    block = layout_block()
    missing = [f for f in folders if not re.search(rf"^{re.escape(f)}/\S*\s", block, re.MULTILINE)]
    assert not missing, f"docs/layout.md's tree has no line starting with {missing}"


def test_every_package_of_topklab_has_its_line_in_the_layout():
    src = ROOT / "src" / "topklab"
    packages = sorted(p.name for p in src.iterdir() if (p / "__init__.py").is_file())
    block = layout_block()
    missing = [p for p in packages if not re.search(rf"^\s+{re.escape(p)}/\s", block, re.MULTILINE)]
    assert not missing, f"docs/layout.md's tree has no line for src/topklab/{missing}"


def experiment_groups() -> list[str]:
    """Each folder of configs/experiment/ holding row yamls: stk/table3, fmnistlt, ..."""
    root = ROOT / "configs" / "experiment"
    return sorted({str(p.parent.relative_to(root)) for p in root.rglob("*.yaml")})


def test_results_at_a_glance_lists_every_row_group_and_table():
    page = (DOCS / "results.md").read_text(encoding="utf-8")
    groups = [g for g in experiment_groups() if f"`{g}/`" not in page and f"{g}/" not in page]
    tables = [t.name for t in sorted((ROOT / "results" / "tables").glob("*.md")) if t.name not in page]
    assert not groups, f"docs/results.md names no row of the experiment groups {groups}"
    assert not tables, f"docs/results.md does not list results/tables/{tables}"


def test_scripts_readme_names_every_script():
    readme = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.suffix in (".py", ".sh"))
    missing = [name for name in scripts if f"`{name}" not in readme]
    assert not missing, f"scripts/README.md says nothing of {missing}"
