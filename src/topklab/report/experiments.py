"""The experiment index, ``experiments/INDEX.md``: every row of ``configs/experiment/`` with the
description its yaml opens with, grouped by folder. Generated (``python -m topklab.report index``)
and compared with the committed file by ``tests/repo/test_experiment_index.py``, so a new row cannot be
missing from it."""

from __future__ import annotations

from pathlib import Path

HEADER = """# Experiment index

Every row of every table: `python train.py experiment=<row>` (tabular rows: see
[README.md](README.md) for the protocol's runner). Generated from `configs/experiment/` by
`python -m topklab.report index`; do not edit by hand. The commands that rerun whole tables are in
[README.md](README.md).
"""


def describe(path: Path) -> str:
    """The row's own description: the first comment line after ``# @package``, without the command
    that some rows append after ``: python``.

    Examples
    --------
    >>> import tempfile
    >>> row = Path(tempfile.mkdtemp()) / "dense.yaml"
    >>> _ = row.write_text('# @package _global_\\n# Row "dense": every token.: python train.py experiment=x\\n')
    >>> describe(row)
    'Row "dense": every token.'
    """
    for line in path.read_text().splitlines():
        if line.startswith("# @package") or not line.startswith("#"):
            continue
        return line.lstrip("# ").split(": python ")[0].strip()
    return ""


def experiment_rows(config_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """``{folder: [(row id, description), ...]}`` for every row yaml (files starting with ``_`` are
    shared parts, not rows), folders and rows sorted."""
    root = config_dir / "experiment"
    groups: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.yaml")):
        if path.name.startswith("_"):
            continue
        row = path.relative_to(root).with_suffix("").as_posix()
        groups.setdefault(path.parent.relative_to(root).as_posix(), []).append((row, describe(path)))
    return groups


def render_index(config_dir: Path) -> str:
    """The whole of ``experiments/INDEX.md``."""
    groups = experiment_rows(config_dir)
    parts = [HEADER, f"{sum(len(rows) for rows in groups.values())} rows in {len(groups)} folders.\n"]
    for folder, rows in groups.items():
        parts.append(
            f"## {folder}\n\n| `experiment=` | row |\n|---|---|\n"
            + "".join(f"| `{row}` | {text.replace('|', chr(92) + '|')} |\n" for row, text in rows)
        )
    return "\n".join(parts)
