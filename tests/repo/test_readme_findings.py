"""The README's findings block ("## What was found") and the verdicts that open docs/evidence.md's
Findings are read from the result files their lines link: for each verdict the test lists the numbers
it checks, reads each from its file (a rendered table under results/tables/, which `make tables` keeps
equal to results/, or a benchmark's table under results/bench/) and fails naming the verdict, the file
and the number when the README or the page says otherwise or no longer links that file (the page links
a table as tables/<name>.md, which the site serves from results/tables/). A verdict that changes in the
results changes in both places or fails."""

import re
from pathlib import Path

import pytest

from helpers import ROOT

README = ROOT / "README.md"
EVIDENCE = ROOT / "docs" / "evidence.md"
PLUS_MINUS = re.compile(r"[−+-]?\d[\d.]* ± \d[\d.]*")


def tables_of(path: Path) -> list[list[dict[str, str]]]:
    """The Markdown tables of a file, each a list of rows as {header: cell}."""
    lines, tables = path.read_text(encoding="utf-8").splitlines(), []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.match(r"^\|(?:\s*:?-+:?\s*\|)+\s*$", lines[i + 1]):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(header, (c.strip() for c in row.strip("|").split("|")))))
            tables.append(rows)
    return tables


def cell(path: Path, column: str, **match: str) -> str:
    """The one cell of ``column`` in the row whose cells equal ``match`` (keys: headers, ``_`` for a space)."""
    match = {k.replace("_", " "): v for k, v in match.items()}
    found = [
        row[column]
        for table in tables_of(path)
        for row in table
        if column in row and all(row.get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, f"{path.name}: {len(found)} rows with {match} and a column {column!r}"
    return found[0]


def pm(text: str) -> str:
    """The "mean ± sd" at the start of a cell such as ``43.31 ± 0.65 (n = 3: …)``."""
    return PLUS_MINUS.match(text).group(0)


def within_std(path: Path) -> str:
    return re.search(r"Ours within the paper's std: (\d+ of \d+) cells", path.read_text(encoding="utf-8")).group(1)


def difference(path: Path, series: str, k: str) -> str:
    return f"{cell(path, 'mean difference', series=series, **{'k/n': k})} {cell(path, '95 % interval', series=series, **{'k/n': k})}"


def table2(column: str) -> str:
    return cell(TABLES / "table2.md", column, **{"": "Accuracy (%), ours"})


def step_share(workload: str) -> str:
    return cell(BENCH / "step_share_cpu.md", "added vs Average", workload=workload, loss="STk")


def cuda_range(column: str) -> str:
    values = [
        float(row[column])
        for table in tables_of(BENCH / "tracked_cuda.md")
        for row in table
        if row.get("dtype") == "float32" and row.get("n") == "1e+08"
    ]
    assert len(values) == 3, values
    return f"{min(values):.2f}–{max(values):.2f}×"


TABLES, BENCH = ROOT / "results" / "tables", ROOT / "results" / "bench"
# verdict -> [(the file its line links, what its line must say, read from that file)]
VERDICTS = {
    "Tabular": lambda: [
        (TABLES / "table3.md", within_std(TABLES / "table3.md")),
        (TABLES / "table4.md", within_std(TABLES / "table4.md")),
        (TABLES / "table6.md", within_std(TABLES / "table6.md")),
    ],
    "Synthetic": lambda: [
        (TABLES / "table2.md", f"STk (SReLU) {table2('STk (SReLU)')}"),
        (TABLES / "table2.md", f"Average {table2('Average')}"),
        (TABLES / "table2.md", f"ATk {table2('ATk')}"),
        (TABLES / "table2.md", re.search(r"Ours: (\d+) repeats", (TABLES / "table2.md").read_text()).group(1)),
    ],
    "Images": lambda: [
        (TABLES / "fmnistlt_full_k.md", f"LA + STk {difference(TABLES / 'fmnistlt_full_k.md', 'LA + STk', '0.9')}"),
        (TABLES / "fmnistlt_full_k.md", f"LA + ATk {difference(TABLES / 'fmnistlt_full_k.md', 'LA + ATk', '0.5')}"),
        (
            TABLES / "fmnistlt_full_k.md",
            f"{cell(TABLES / 'fmnistlt_full_k.md', 'seeds', series='LA + STk', **{'k/n': '0.9'})} seeds",
        ),
    ],
    "Translation": lambda: [
        (TABLES / "multi30k_k.md", f"STk {difference(TABLES / 'multi30k_k.md', 'STk', '0.96')}"),
        (TABLES / "multi30k_k.md", f"STk {difference(TABLES / 'multi30k_k.md', 'STk', '0.5')}"),
        (TABLES / "multi30k_k.md", f"{cell(TABLES / 'multi30k_k.md', 'seeds', series='STk', **{'k/n': '0.96'})} seeds"),
    ],
    "STk as a layer": lambda: [
        (
            TABLES / "routing.md",
            pm(cell(TABLES / "routing.md", "test ppl (mean ± sample sd, n seeds)", row="STk threshold, c = 0.125 ‡")),
        ),
        (
            TABLES / "routing.md",
            pm(cell(TABLES / "routing.md", "test ppl (mean ± sample sd, n seeds)", row="top-k (MoD), c = 0.125 ‡")),
        ),
        (
            TABLES / "gradient_sparsification.md",
            pm(
                cell(
                    TABLES / "gradient_sparsification.md",
                    "test top-1 (mean ± sample sd, n seeds)",
                    row="STk threshold, 1 %",
                )
            ),
        ),
        (
            TABLES / "gradient_sparsification.md",
            pm(
                cell(
                    TABLES / "gradient_sparsification.md",
                    "test top-1 (mean ± sample sd, n seeds)",
                    row="exact top-k, 1 %",
                )
            ),
        ),
    ],
    "Speed on CPU": lambda: [
        (BENCH / "step_share_cpu.md", step_share("tabular MLP (australian; logistic, AdaGrad)")),
        (BENCH / "step_share_cpu.md", step_share("ResNet-32 on fmnistlt (LA individual loss, SGD)")),
        (BENCH / "step_share_cpu.md", step_share("small Transformer on Multi30k (token losses, AdamW)")),
    ],
    "Speed on GPU": lambda: [
        (BENCH / "tracked_cuda.md", cuda_range("STk (track, triton)")),
        (BENCH / "tracked_cuda.md", cuda_range("ATk (topk)")),
        (BENCH / "tracked_cuda.md", re.search(r"on (NVIDIA \S+)", (BENCH / "tracked_cuda.md").read_text()).group(1)),
    ],
}


def bullets(block: str) -> dict[str, str]:
    """``{verdict: its line}`` of a block's ``- **verdict** ...`` bullets, each bullet's lines joined."""
    found = re.findall(r"^- \*\*(.+?)\*\*(.*?)(?=^- |^\s*$)", block + "\n\n", re.MULTILINE | re.DOTALL)
    return {name: " ".join(rest.split()) for name, rest in found}


def findings() -> dict[str, str]:
    """``{verdict: its line}`` of the README's findings block."""
    text = README.read_text(encoding="utf-8")
    return bullets(text.split("## What was found", 1)[1].split("\n## ", 1)[0])


def page_verdicts() -> dict[str, str]:
    """``{verdict: its line}`` of the verdicts that open docs/evidence.md's Findings (its first list)."""
    text = EVIDENCE.read_text(encoding="utf-8")
    section = text.split("## Findings", 1)[1]
    return bullets(section[section.index("\n- **") + 1 :].split("\n\n", 1)[0])


def test_the_readme_opens_with_the_findings_and_links_the_pages():
    text = README.read_text(encoding="utf-8")
    assert text.index("## What was found") < text.index("make demo")
    assert list(findings()) == list(VERDICTS), "one line per verdict, in this order"
    block = text.split("## What was found", 1)[1].split("\n## ", 1)[0]
    assert "](docs/results.md)" in block and "](docs/evidence.md#findings)" in block


@pytest.mark.parametrize("verdict", list(VERDICTS))
def test_each_number_of_the_findings_is_read_from_the_file_its_line_links(verdict):
    line = findings()[verdict]
    for path, number in VERDICTS[verdict]():
        link = f"]({path.relative_to(ROOT)})"
        assert link in line, f"README's {verdict} line does not link {path.relative_to(ROOT)}"
        assert number in line, f"README's {verdict} line should say {number!r} ({path.relative_to(ROOT)}):\n{line}"


def test_the_findings_page_opens_with_the_current_verdicts():
    text = EVIDENCE.read_text(encoding="utf-8")
    first = re.findall(r"^## (.+)$", text, re.MULTILINE)[0]
    assert first == "Findings", f"docs/evidence.md's first section is {first!r}, not the findings"
    prose = " ".join(text.split())
    assert prose.index("## Findings") < prose.index("fmnistlt's LA + STk seed 4"), "the superseded runs come last"
    assert list(page_verdicts()) == ["Images", "Translation", "Tabular", "Synthetic", "STk as a layer"]


@pytest.mark.parametrize("verdict", ["Images", "Translation", "Tabular", "Synthetic", "STk as a layer"])
def test_each_verdict_of_the_findings_page_is_read_from_the_table_it_links(verdict):
    line = page_verdicts()[verdict]
    for path, number in VERDICTS[verdict]():
        link = f"]({path.parent.name}/{path.name})"
        assert link in line, f"docs/evidence.md's {verdict} line does not link {link[2:-1]}"
        assert number in line, f"docs/evidence.md's {verdict} line should say {number!r} ({path.name}):\n{line}"
