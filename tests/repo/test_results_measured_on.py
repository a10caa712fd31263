"""docs/results.md says where each result was measured: a "measured on" column in every table, and every GPU
result file and device-run folder on the page with the GPU that its own file names."""

import re

from helpers import ROOT

PAGE = ROOT / "docs" / "results.md"


def tables(text: str) -> list[list[list[str]]]:
    blocks, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip("|").split("|")])
        elif block:
            blocks.append(block)
            block = []
    return blocks


def test_every_table_has_a_measured_on_column_filled_in_every_row():
    blocks = tables(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    for block in blocks:
        head = block[0]
        assert "measured on" in head, head
        column = head.index("measured on")
        for row in block[2:]:
            assert len(row) == len(head) and row[column], row
            assert row[column] == "—" or "CPU" in row[column] or "NVIDIA" in row[column], row


def test_every_gpu_result_and_device_run_is_listed_with_the_gpu_its_files_name():
    text = PAGE.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for path in sorted((ROOT / "results" / "bench").glob("*_cuda*.md")):
        row = next((r for r in rows if path.name in r), None)
        assert row is not None, f"{path.name} is not on docs/results.md"
        named = re.search(r"NVIDIA H\d00", path.read_text(encoding="utf-8"))
        if named:
            assert named.group(0) in row, (path.name, named.group(0))
    for folder in sorted(p for p in (ROOT / "experiments" / "device_runs").iterdir() if p.is_dir()):
        row = next((r for r in rows if folder.name in r), None)
        assert row is not None, f"experiments/device_runs/{folder.name} is not on docs/results.md"
        machine = (folder / "README.md").read_text(encoding="utf-8")
        gpu = re.search(r"NVIDIA H\d00", machine).group(0)
        assert gpu in row, (folder.name, gpu)
