"""Every "a ± b" in a rendered table (results/tables/*.md), a page under docs/ and the README says
which sd its ± is (the population sd, ddof 0, or the sample sd, ddof 1; a paper's ± "std" whose kind
the paper does not state is said to be so) and over how many values (n): on its own line, in its
paragraph, in the header row or caption of its table, in the lead-in of its list, or in the file's
title."""

import re

import pytest

from helpers import ROOT

PLUS_MINUS = re.compile(r"\d\s*±\s*\.?\d")
SD_KIND = re.compile(r"(?i)\b(?:population|sample) (?:sd|std)\b|\bddof\b|which sd\b")
NUMBERS = "two|three|four|five|six|seven|eight|nine|ten|\\d[\\d,]*"
N_STATED = re.compile(
    rf"\bn = \d|\bn\b,? (?:seeds|splits|runs|repeats|values)|\b(?:{NUMBERS}) (?:seeds|splits|runs|repeats)\b"
    r"|^\|(?:.*\|)? *(?:n|seeds|splits|runs) *\|",
    re.IGNORECASE | re.MULTILINE,
)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def blocks(text: str) -> list[str]:
    """The file's blocks between blank lines, code blocks blanked out."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [b for b in re.split(r"\n\s*\n", text) if b.strip()]


def unstated(text: str) -> list[str]:
    """The lines with an "a ± b" whose sd or n is nowhere in its scope."""
    title = next((line for line in text.splitlines() if line.startswith("# ")), "")
    found, lead_in = [], ""
    for block in blocks(text):
        first = block.lstrip()
        is_table = first.startswith("|")
        is_list = bool(re.match(r"(?:[-*]|\d+\.) ", first))
        if is_table:
            header = block.strip().splitlines()[0]
            scope = "\n".join((lead_in, header, title))
        elif is_list:
            scope = "\n".join((lead_in, title))
        else:
            lead_in, scope = block, "\n".join((title,))
        for line in block.splitlines():
            if not PLUS_MINUS.search(line):
                continue
            here = "\n".join((line, scope, block if not is_table else ""))
            if not (SD_KIND.search(here) and N_STATED.search(here)):
                found.append(line.strip()[:120])
    return found


def rendered_and_written():
    yield from sorted((ROOT / "results" / "tables").glob("*.md"))
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield ROOT / "README.md"


def test_the_check_reads_a_caption_a_header_and_a_paragraph():
    caption = "# t: mean ± population sd over n seeds\n\n"
    assert unstated(caption + "| row | seeds | top-1 |\n|---|---|---|\n| LA | 5 | 83.75 ± 0.46 |") == []
    assert (
        unstated("Ours, mean ± sample sd (ddof 1):\n\n| row | n | top-1 |\n|---|---|---|\n| LA | 5 | 1.0 ± 0.5 |") == []
    )
    assert unstated("Over three seeds BLEU is 38.23 ± 0.42 (population sd).") == []
    assert unstated("| row | mean ± sd |\n|---|---|\n| LA | 83.75 ± 0.51 |") == ["| LA | 83.75 ± 0.51 |"]
    assert unstated("It reads 68.03 ± 3.45 % over 4 seeds.") == ["It reads 68.03 ± 3.45 % over 4 seeds."]
    assert unstated("labels ±1, ±inf and mean ± t · sd / √n") == []


@pytest.mark.parametrize("path", list(rendered_and_written()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_plus_minus_says_which_sd_and_n(path):
    found = unstated(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: say which sd (population / sample) and n for:\n" + "\n".join(found)
