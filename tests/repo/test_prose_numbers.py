"""Numbers the pages' prose states about stored runs are read from the result files: for each, the test
lists the file it is stated in, what it must say and how that is computed from the stored results, and
fails naming the file and the number when the prose says otherwise. The numbers it checks:

- the ResNet-8's parameter count (docs/evidence.md, configs/model/resnet8.yaml): ``parameters.total`` of
  every fmnistlt_full run;
- the fmnistlt_full runs' training time (docs/evidence.md): the range of ``train_seconds`` over its runs;
- the Multi30k k-sweep runs' training time (docs/translation.md, docs/evidence.md): the range of
  ``train_seconds`` over the rows at k/n 0.5, 0.7 and 0.9 (``*_k50``, ``*_k70``, ``*_k90``), in hours;
- the hard shares of fmnistlt_full's STk rows (docs/evidence.md): ``lambda_tracking.hard_share``, the mean
  over each row's seeds, to three decimals.

It also keeps the pages' Markdown table rows short enough to read in a diff."""

import json

import pytest

from helpers import ROOT

RESULTS, DOCS = ROOT / "results", ROOT / "docs"
MAX_TABLE_ROW = 800  # characters


def summaries(pattern: str) -> list[dict]:
    files = sorted(RESULTS.glob(pattern))
    assert files, f"no stored results match results/{pattern}"
    return [json.loads(f.read_text(encoding="utf-8"))["result"]["summary"] for f in files]


def parameters() -> str:
    counts = {s["parameters"]["total"] for s in summaries("vision/fmnistlt_full/*/seed*.json")}
    assert len(counts) == 1, counts
    return f"{counts.pop():,} parameters"


def seconds_range(pattern: str) -> str:
    seconds = [s["train_seconds"] for s in summaries(pattern)]
    return f"{min(seconds):.0f}–{max(seconds):.0f} s"


def hours_range(pattern: str) -> str:
    hours = [s["train_seconds"] / 3600 for s in summaries(pattern)]
    return f"{min(hours):.2f}–{max(hours):.2f} h"


def hard_share(row: str) -> str:
    shares = [s["lambda_tracking"]["hard_share"] for s in summaries(f"vision/fmnistlt_full/{row}/seed*.json")]
    return f"{sum(shares) / len(shares):.3f}"


# (the file that states it, the number as computed from the results)
NUMBERS = {
    "ResNet-8's parameters, evidence": (DOCS / "evidence.md", parameters),
    "ResNet-8's parameters, model config": (ROOT / "configs" / "model" / "resnet8.yaml", parameters),
    "fmnistlt_full training time": (DOCS / "evidence.md", lambda: seconds_range("vision/fmnistlt_full/*/seed*.json")),
    "Multi30k sweep run time, translation": (
        DOCS / "translation.md",
        lambda: hours_range("translation/multi30k/*_k[579]0/seed*.json"),
    ),
    **{
        f"hard share of {row}, evidence": (DOCS / "evidence.md", lambda row=row: hard_share(row))
        for row in ("la_stk_k50", "la_stk_k70", "la_stk", "la_stk_k96")
    },
    "Multi30k sweep run time, evidence": (
        DOCS / "evidence.md",
        lambda: hours_range("translation/multi30k/*_k[579]0/seed*.json"),
    ),
}


@pytest.mark.parametrize("what", list(NUMBERS))
def test_the_prose_states_the_stored_number(what):
    path, number = NUMBERS[what]
    expected = number()
    prose = " ".join(path.read_text(encoding="utf-8").split())  # a number may break across lines
    assert expected in prose, f"{path.relative_to(ROOT)} should say {expected!r} ({what})"


def test_no_table_row_of_a_page_is_too_long_to_read():
    long = [
        f"{page.relative_to(ROOT)}:{number}: {len(line)} characters"
        for page in sorted(DOCS.rglob("*.md"))
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if line.startswith("|") and len(line) > MAX_TABLE_ROW
    ]
    assert not long, f"split these table rows (at most {MAX_TABLE_ROW} characters):\n" + "\n".join(long)
