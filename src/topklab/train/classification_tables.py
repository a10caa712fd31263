"""Markdown tables of the vision experiments from their result files
(``results/vision/<table>/<row>/seed<k>.json``, written by ``train.py vision=<table>/<row>``):
mean ± std over seeds of top-1, top-5 and the many / medium / few-shot accuracies, the paper's
value beside ours where it has one, and the per-class accuracy."""
from __future__ import annotations

import json
from pathlib import Path

from topklab.synthetic.tables import mean_std
from topklab.utils.errors import TopklabError

METRICS = ("top1", "top5", "many", "medium", "few")
METRIC_NAMES = {"top1": "top-1", "top5": "top-5", "many": "many", "medium": "medium", "few": "few"}


def load_table(directory: Path) -> dict[str, list[dict]]:
    """``{row: [result, ...]}`` over the seeds stored under ``directory``; a corrupt file is an error."""
    rows = {}
    for path in sorted(directory.glob("*/seed*.json")):
        try:
            result = json.loads(path.read_text())
            result["summary"]["metrics"]["test"]
        except (ValueError, KeyError, TypeError) as err:
            raise TopklabError(f"{path} is corrupt ({err!r}); delete it and rerun its row") from None
        rows.setdefault(path.parent.name, []).append(result)
    return rows


def cell(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}"


def selected_test(result: dict, metric: str):
    """The test value of ``metric`` at the epoch selected for it (per-metric selection, as
    difftopk reports), else at the run's primary selection."""
    selection = result["summary"].get("selection", {})
    if metric in selection:
        return selection[metric]["test"]
    return result["summary"]["metrics"]["test"].get(metric)


def render_vision_table(name: str, rows: dict[str, list[dict]], labels: dict[str, str], order: list[str],
                        paper: dict | None = None) -> str:
    """Markdown for one vision table. ``order``: row names in table order; ``labels``: row -> label;
    ``paper``: ``{"caption", "note", "rows": {row: {metric: value}}}`` or None."""
    present = [r for r in order if r in rows] + sorted(set(rows) - set(order))
    if not present:
        raise TopklabError(f"no results for the {name} table; run its rows first (README, vision)")
    first = rows[present[0]][0]
    commands = sorted({r["command"] for runs in rows.values() for r in runs})
    shas = sorted({str(r["provenance"]["git"].get("sha", "?"))[:10] for runs in rows.values() for r in runs})
    trainer = first["config"]["trainer"]
    published = (paper or {}).get("rows", {})
    lines = [f"# {name}: test accuracy (%), mean ± std over seeds", ""]
    if paper:
        lines += [f"Paper: {paper['caption']}." + (f" {paper['note']}" if paper.get("note") else ""), ""]
    lines += [
        f"Each row: `python train.py vision={name}/<row> seed=<k>` ({trainer['epochs']} epochs, batch "
        f"{trainer['batch_size']}, test numbers from the best-validation epoch of "
        f"{', '.join(trainer['select_metrics'])}); code {', '.join(shas)}. Then `python scripts/make_tables.py`.  ",
        f"Commands: {'; '.join(f'`{c}`' for c in commands[:3])}{' …' if len(commands) > 3 else ''}.  ",
        "Many / medium / few: classes with more than 100, 20–100, fewer than 20 training images "
        "(mean of their per-class accuracies).", "",
    ]
    has_paper = any(published.get(r) for r in present)
    head = ["row", "seeds"] + [METRIC_NAMES[m] for m in METRICS] + (["paper top-1", "paper top-5"] if has_paper else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in present:
        runs = rows[row]
        cells = [labels.get(row, row), str(len(runs))] + [cell(selected_test(r, m) for r in runs) for m in METRICS]
        if has_paper:
            values = published.get(row, {})
            cells += [f"{values[m]:.2f}" if m in values else "—" for m in ("top1", "top5")]
        lines.append("| " + " | ".join(cells) + " |")
    counts = first["summary"].get("class_counts")
    if counts and len(counts) <= 20:
        lines += ["", "Per-class test accuracy (%), mean over seeds; training images per class in the header.", "",
                  "| row | " + " | ".join(f"{c} ({n})" for c, n in enumerate(counts)) + " |",
                  "|---|" + "---|" * len(counts)]
        for row in present:
            per_class = [[r["summary"]["metrics"]["test"]["per_class"][c] for r in rows[row]] for c in range(len(counts))]
            lines.append(f"| {labels.get(row, row)} | " + " | ".join(
                f"{mean_std([v for v in values if v is not None])[0]:.1f}" if any(v is not None for v in values) else "—"
                for values in per_class) + " |")
    return "\n".join(lines) + "\n"
