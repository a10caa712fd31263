"""Every "papers.md §x.y" in the repository (configs, src/, docs, experiments/INDEX.md, results/ with
its rendered tables) names a section that docs/papers.md's notes have: a heading with the id
``s<x>-<y>`` on docs/papers.md or a page under docs/papers/, listed and linked from docs/papers.md."""

import re
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

DOCS = ROOT / "docs"
SELF = Path(__file__).resolve()  # holds the examples the pattern must read
SECTION = r"§(\d+(?:\.\d+)?)"
# "papers.md", a closing backquote, then (across a line break and a comment's "#") the first section,
# then more joined by ",", "and" or a dash (a range): "papers.md §1.11, §1.13", "papers.md` §1.9–§1.13"
CITATION = re.compile(rf"papers\.md`?[\s#*]*{SECTION}((?:\s*(?:,|and|–|-)\s*§\d+(?:\.\d+)?)*)")
HEADING_ID = re.compile(r"^#{1,6} .*\{ *#s(\d+)(?:-(\d+))? *\}\s*$", re.MULTILINE)


def cited(text: str) -> list[str]:
    """The sections a text cites as "papers.md §...", a range "§1.9–§1.13" spelt out."""
    found = []
    for match in CITATION.finditer(text):
        parts = re.split(r"\s*(,|and|–|-)\s*", match.group(0)[match.group(0).index("§") :])
        joins = parts[1::2]
        sections = [p.lstrip("§") for p in parts[0::2]]
        found.append(sections[0])
        for join, before, after in zip(joins, sections, sections[1:]):
            b, a = before.split("."), after.split(".")
            if join in "–-" and len(a) == len(b) == 2 and a[0] == b[0]:
                found += [f"{a[0]}.{m}" for m in range(int(b[1]) + 1, int(a[1]))]
            found.append(after)
    return found


def defined() -> dict[str, Path]:
    """Section number -> the page whose heading carries its id."""
    pages = [DOCS / "papers.md", *sorted((DOCS / "papers").glob("*.md"))]
    sections: dict[str, Path] = {}
    for page in pages:
        for major, minor in HEADING_ID.findall(page.read_text(encoding="utf-8")):
            number = major if not minor else f"{major}.{minor}"
            assert number not in sections, f"§{number} has two headings: {sections[number]} and {page}"
            sections[number] = page
    return sections


def tracked_text_files():
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in filter(None, done.stdout.decode().split("\0")):
        path = ROOT / name
        if path == SELF or not path.is_file():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def test_the_pattern_reads_lists_ranges_and_wrapped_lines():
    assert cited("(papers.md §1.10)") == ["1.10"]
    assert cited("papers.md §1.11, §1.13") == ["1.11", "1.13"]
    assert cited("papers.md §1.12, §1.14, §1.15") == ["1.12", "1.14", "1.15"]
    assert cited("`docs/papers.md` §1.9–§1.13;") == ["1.9", "1.10", "1.11", "1.12", "1.13"]
    assert cited("Tables 2+3 (ImageNet-1K), papers.md\n# §2.4 and difftopk's README") == ["2.4"]
    assert cited("(papers.md §1.12; anchors.md §16)") == ["1.12"]  # another file's section is not ours
    assert cited("a '–' in papers.md is null") == []


def test_every_section_has_one_heading_and_a_line_in_the_index():
    sections = defined()
    assert {"1.0", "1.10", "1.17", "2.6", "3.6", "4.4", "5"} <= set(sections)
    index = (DOCS / "papers.md").read_text(encoding="utf-8")
    unlisted = [
        number
        for number, page in sections.items()
        if page != DOCS / "papers.md" and f"(papers/{page.name}#s{number.replace('.', '-')})" not in index
    ]
    assert not unlisted, f"docs/papers.md links no line to these sections: {unlisted}"


def test_every_citation_names_a_section_of_the_notes():
    sections = defined()
    missing = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: §{number}"
        for name, text in tracked_text_files()
        for match in CITATION.finditer(text)
        for number in cited(match.group(0))
        if number not in sections
    ]
    assert not missing, "docs/papers.md (or docs/papers/) has no section for:\n" + "\n".join(missing)


def test_the_citations_are_found():
    """The scan reads the files it should: the configs, src/ and the rendered tables cite the notes."""
    citing = {name.split("/", 1)[0] for name, text in tracked_text_files() if CITATION.search(text)}
    assert {"configs", "src", "results", "experiments", "docs"} <= citing
