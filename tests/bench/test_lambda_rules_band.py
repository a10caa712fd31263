"""scripts/lambda_rules_band.py in its quick mode: a row for every λ rule (and the library default) in
each loss's tables, every share a number in [0, 1], and "solve" in band on large uniform batches."""

import json
import re

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    script = load_script("lambda_rules_band")
    out = tmp_path_factory.mktemp("lambda_rules")
    threads = torch.get_num_threads()
    try:
        assert script.main(["--quick", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    envelope = json.loads((out / "lambda_rules_cpu_quick.json").read_text())
    return script, envelope, (out / "lambda_rules_cpu_quick.md").read_text()


def table_rows(text: str, heading: str) -> dict[tuple[str, str], list[str]]:
    """The body rows of the table under the line ``heading``: (rule, distribution) -> the cells."""
    lines = text.splitlines()
    after = lines[lines.index(heading) + 1 :]
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    table = []
    for line in after[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    return {(cells[0], cells[1]): cells[2:] for cells in table[2:]}


def heading_of(text: str, title: str, part: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("#") and f" {title}: {part}" in line]
    return line


@pytest.mark.integration
def test_every_rule_has_its_rows_and_every_share_is_in_0_1(quick_run):
    script, envelope, text = quick_run
    result, settings = envelope["result"], envelope["config"]
    listed, _ = script.library_rules()
    assert settings["rules"] == [script.DEFAULT, *[r for r in listed if r != script.DEFAULT]]
    assert envelope["command"].startswith("python scripts/lambda_rules_band.py --quick")
    assert "at commit " in text and f"torch {torch.__version__}" in text
    for loss in settings["losses"]:
        title = script.LOSSES[loss][0]
        labels = [f"default ({result['defaults'][loss]})", *settings["rules"][1:]]
        width = {"minimum over k": len(settings["ns"]), "every k": len(settings["ns"]) * len(settings["ks"])}
        for heading, columns in width.items():
            rows = table_rows(text, heading_of(text, title, heading))
            assert {rule for rule, _ in rows} == set(labels)
            assert len(rows) == len(labels) * len(settings["distributions"])
            for cells in rows.values():
                assert len(cells) == columns
                for cell in cells:
                    assert cell == "—" or 0.0 <= float(cell) <= 1.0
        assert re.search(
            rf"\*\*{title}'s library default \(.+\): minimum in-band share over all cells [0-9.]+\*\*", text
        )
    cells = result["cells"]
    assert len(cells) == len(settings["losses"]) * len(settings["rules"]) * len(settings["ns"]) * len(
        settings["ks"]
    ) * len(settings["distributions"])
    for cell in cells:
        if cell["in_band_all"] is None:  # a rule the loss does not take (the table's —)
            assert cell["error"]
            continue
        assert cell["calls"] == settings["calls"]
        assert cell["in_band_all"] == cell["in_band_all_hits"] / cell["calls"]
        assert 0.0 <= cell["in_band_all"] <= 1.0
        assert cell["sgd_on_lambda"] == (cell["rule_name"] == "gradient")
    assert all(c["in_band_all"] is not None for c in cells if c["rule"] in (script.DEFAULT, "solve"))


@pytest.mark.integration
def test_solve_is_in_band_on_large_uniform_batches(quick_run):
    _, envelope, _ = quick_run
    for loss in envelope["config"]["losses"]:
        (cell,) = [
            c
            for c in envelope["result"]["cells"]
            if c["loss"] == loss
            and c["rule"] == "solve"
            and c["n"] == 4096
            and c["k"] == 0.5
            and c["distribution"] == "uniform"
        ]
        assert cell["in_band_all"] >= 0.9, cell
