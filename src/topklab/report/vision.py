"""Markdown tables of the vision experiments from their results (``results/vision/``, one file per
run with payload ``{table, row, label, summary}``): mean ± std over seeds of top-1, top-5 and the
many / medium / few-shot accuracies, the paper's value beside ours where it has one, and the
per-class accuracy. A paper table is matched to a vision table by its ``vision_table`` field in
``results/paper/*.yaml``; its row order is the table's order, then the experiment group's rows (the
baseline, then each series by k: :func:`~topklab.report.paired.row_order`), other rows by id."""

from __future__ import annotations

import statistics
from pathlib import Path

from topklab.report.divergence import diverged, divergence_lines
from topklab.report.paired import (
    control_lines,
    missing_runs,
    paired_lines,
    render_sweep_table,
    row_order,
    sweep_points,
    table_groups,
)
from topklab.report.resumed import resumed, resumed_footnote, seed_of
from topklab.report.schema import code_versions
from topklab.report.stats import mean_std
from topklab.report.tracking import band_cell, below_every_loss_lines, flag_lines, hard_share_cell
from topklab.utils.errors import TopklabError

METRICS = ("top1", "top5", "many", "medium", "few", "ece")  # ECE: shown when the results have it
METRIC_NAMES = {"top1": "top-1", "top5": "top-5", "many": "many", "medium": "medium", "few": "few", "ece": "ECE (%)"}


def by_table(results: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """``{table: {row: [result, ...]}}`` in the order the results come (one result per seed).

    Examples
    --------
    >>> by_table([{"result": {"table": "t", "row": "a"}}])
    {'t': {'a': [{'result': {'table': 't', 'row': 'a'}}]}}
    """
    tables: dict[str, dict[str, list[dict]]] = {}
    for result in results:
        tables.setdefault(result["result"]["table"], {}).setdefault(result["result"]["row"], []).append(result)
    return tables


def cell(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}"


def selected_test(summary: dict, metric: str):
    """The test value of ``metric`` at the epoch selected for it (per-metric selection, as
    difftopk reports), else at the run's primary selection."""
    selection = summary.get("selection", {})
    if metric in selection:
        return selection[metric]["test"]
    return summary["metrics"]["test"].get(metric)


def top1(result: dict):
    """A run's test top-1 at its selected epoch (the value the tables and their pairs compare)."""
    return selected_test(result["result"]["summary"], "top1")


def render_vision_table(
    name: str, rows: dict[str, list[dict]], paper: dict | None = None, settings: dict | None = None
) -> str:
    """Markdown for one vision table.

    Parameters
    ----------
    name : the table id (payload ``table``)
    rows : ``{row: [result, ...]}`` of that table (:func:`by_table`)
    paper : ``{"caption", "note", "rows": {row: {metric: value}}}`` from results/paper, or None
    settings : what the table's experiment group declares (:func:`~topklab.report.paired.table_groups`),
        or None: its ``superseded_by`` heads the table; with a ``baseline``, the rows and seeds not yet run
        head it and the rows' paired differences from the baseline follow it

    Examples
    --------
    >>> text = render_vision_table("fmnistlt", by_table(read_results("results/vision"))["fmnistlt"])  # doctest: +SKIP
    """
    published = (paper or {}).get("rows", {})
    order = list(dict.fromkeys([*published, *row_order(settings)]))
    present = [r for r in order if r in rows] + sorted(set(rows) - set(order))
    if not present:
        raise TopklabError(f"no results for the {name} table; run its rows first (docs/vision.md)")
    runs = [r for row in present for r in rows[row]]
    first = runs[0]
    labels = {row: rows[row][0]["result"]["label"] for row in present}
    commands = sorted({r["command"] for r in runs})
    trainer = first["config"].get("engine") or first["config"]["trainer"]  # results before the engine: trainer
    task = first["config"].get("task") or {}
    many, few = task.get("many_shot", 100), task.get("few_shot", 20)
    lines = [
        f"# {name}: test accuracy (%), mean ± std over seeds (population std; the sample std is √(n/(n − 1)) times it)",
        "",
    ]
    settings = settings or {}
    if settings.get("superseded_by"):
        lines += [
            f"**Superseded by `{settings['superseded_by']}`** (docs/evidence.md): kept as committed; its seeds "
            "spread too widely for its rows to be told apart.",
            "",
        ]
    if settings.get("baseline"):
        left = missing_runs(settings, rows)
        if left:
            lines += [
                f"**Still missing** (`python scripts/run_sweep.py '{settings['group']}/*'` runs each row's declared "
                f"seeds, then `make tables`): {', '.join(left)}.",
                "",
            ]
    missing = [r for r in published if r not in rows]
    if missing:
        lines += [
            f"**Still missing:** {', '.join(missing)} (run their experiment rows, {paper.get('experiments', 'see README')}; "
            f"then `make tables`).",
            "",
        ]
    if paper:
        lines += [f"Paper: {paper['caption']}." + (f" {paper['note']}" if paper.get("note") else ""), ""]
    reported = (
        "the last epoch (as PEL/LIFT report)"
        if trainer.get("report_state") == "last"
        else f"the best-validation epoch of {', '.join(trainer['select_metrics'])}"
    )
    lines += [
        f"Each row: `python train.py experiment=<row> seed=<k>` (experiments/README.md; {trainer['epochs']} epochs, batch "
        f"{trainer['batch_size']}, test numbers from {reported}); code {code_versions(runs)}. Then `make tables`.  ",
        f"Commands: {'; '.join(f'`{c}`' for c in commands[:3])}{' …' if len(commands) > 3 else ''}.  ",
        f"Many / medium / few: classes with more than {many:,}, {few:,}–{many:,}, fewer than {few:,} training images "
        "(mean of their per-class accuracies).",
        "",
    ]
    has_paper = any(published.get(r) for r in present)
    metrics = [
        m for m in METRICS if m != "ece" or any("ece" in r["result"]["summary"]["metrics"]["test"] for r in runs)
    ]
    thresholded = any(r["result"]["summary"].get("lambda") is not None for r in runs)
    head = (
        ["row", "seeds"]
        + [METRIC_NAMES[m] for m in metrics]
        + (["λ in band", "hard share > λ"] if thresholded else [])
        + (["paper top-1", "paper top-5"] if has_paper else [])
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    kept = {row: [r for r in rows[row] if not diverged(r)] for row in present}
    for row in present:
        summaries = [r["result"]["summary"] for r in kept[row]]
        dropped = len(rows[row]) - len(summaries)
        cells = [labels[row], str(len(summaries)) + (f" (+{dropped} diverged)" if dropped else "")]
        cells += [cell(selected_test(s, m) for s in summaries) for m in metrics]
        if thresholded:
            summaries_all = [r["result"]["summary"] for r in rows[row]]
            cells += [band_cell(summaries_all), hard_share_cell(summaries_all)]
        if has_paper:
            values = published.get(row, {})
            cells += [f"{values[m]:.2f}" if m in values else "—" for m in ("top1", "top5")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += flag_lines({row: rows[row] for row in present}, labels)
    lines += below_every_loss_lines({row: rows[row] for row in present}, labels)
    lines += divergence_lines({row: rows[row] for row in present}, labels, seed_of)
    if settings.get("baseline"):
        lines += paired_lines(present, rows, labels, settings["baseline"], top1, "test top-1")
    lines += control_lines(settings.get("controls") or {}, rows, labels, top1, "test top-1")
    lines += per_seed_table(present, rows, labels)
    counts = first["result"]["summary"].get("class_counts")
    if counts and len(counts) <= 20:
        lines += [
            "",
            "Per-class test accuracy (%), mean over seeds; training images per class in the header.",
            "",
            "| row | " + " | ".join(f"{c} ({n})" for c, n in enumerate(counts)) + " |",
            "|---|" + "---|" * len(counts),
        ]
        for row in present:
            per_class = [
                [r["result"]["summary"]["metrics"]["test"]["per_class"][c] for r in kept[row]]
                for c in range(len(counts))
            ]
            lines.append(
                f"| {labels[row]} | "
                + " | ".join(
                    f"{mean_std([v for v in values if v is not None])[0]:.1f}"
                    if any(v is not None for v in values)
                    else "—"
                    for values in per_class
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


def per_seed_table(
    present: list[str], rows: dict[str, list[dict]], labels: dict[str, str], most: int = 10
) -> list[str]:
    """Markdown lines of each row's top-1 seed by seed, with its median and range: the distribution
    behind mean ± std, which on a chaotic set can be bimodal (a diverged run marked, and counted in the
    median and range), § after a resumed run's (named in a footnote,
    :func:`~topklab.report.resumed.resumed_footnote`); nothing when no row has two seeds or
    the runs span more than ``most`` seeds.

    Examples
    --------
    >>> run = lambda seed, top1: {"provenance": {"seeds": {"seed": seed}},
    ...                           "result": {"summary": {"selection": {"top1": {"test": top1}}}}}
    >>> print(per_seed_table(["a"], {"a": [run(0, 60.0), run(1, 70.0), run(2, 61.0)]}, {"a": "A"})[-1])
    | A | 60.00 | 70.00 | 61.00 | 61.00 | 60.00–70.00 |
    """

    seeds = sorted({seed_of(r) for row in present for r in rows[row]}, key=lambda s: (s is None, s))
    if max(len(rows[row]) for row in present) < 2 or len(seeds) > most:
        return []
    lines = [
        "",
        "Top-1 (%) per seed, with the median and the range over seeds.",
        "",
        "| row | " + " | ".join(f"seed {s}" for s in seeds) + " | median | range |",
        "|---|" + "---|" * (len(seeds) + 2),
    ]
    for row in present:
        by_seed = {seed_of(r): selected_test(r["result"]["summary"], "top1") for r in rows[row]}
        marks = {seed_of(r): (" (diverged)" if diverged(r) else "") + (" §" if resumed(r) else "") for r in rows[row]}
        values = sorted(v for v in by_seed.values() if v is not None)
        lines.append(
            f"| {labels[row]} | "
            + " | ".join("—" if by_seed.get(s) is None else f"{by_seed[s]:.2f}{marks[s]}" for s in seeds)
            + (f" | {statistics.median(values):.2f} | {values[0]:.2f}–{values[-1]:.2f} |" if values else " | — | — |")
        )
    return lines + resumed_footnote(present, rows, labels)


def render_pending_table(name: str, paper: dict) -> str:
    """Markdown for a paper table none of whose rows has a result yet: what to run, and the paper's
    values where it has them.

    Examples
    --------
    >>> print(render_pending_table("t", {"caption": "C", "rows": {"a": {"top1": 1.0}, "b": {}}}).splitlines()[2])
    **Still missing:** every row (2: a, b); run their experiment rows (see README), then `make tables`.
    """
    rows = paper["rows"]
    lines = [
        f"# {name}: test accuracy (%), mean ± std over seeds (population std, n: the seeds of the row)",
        "",
        f"**Still missing:** every row ({len(rows)}: {', '.join(rows)}); run their experiment rows "
        f"({paper.get('experiments', 'see README')}), then `make tables`.",
        "",
        f"Paper: {paper['caption']}." + (f" {paper['note']}" if paper.get("note") else ""),
        "",
    ]
    if any(rows.values()):
        lines += ["| row | paper top-1 | paper top-5 |", "|---|---|---|"]
        lines += [
            f"| {row} | " + " | ".join(f"{values[m]:.2f}" if m in values else "—" for m in ("top1", "top5")) + " |"
            for row, values in rows.items()
        ]
    return "\n".join(lines) + "\n"


def render_vision(results: list[dict], papers: list[dict], configs: Path | None = None) -> dict[str, str]:
    """``{"<table>.md": text}`` for every vision table with results.

    Parameters
    ----------
    results : every vision result (``read_results(results/"vision", "vision")``)
    papers : the loaded ``results/paper/*.yaml`` files; a top-level entry with ``vision_table: <table>``
        gives that table's caption, note, row order and published values; a table with such an entry
        and no result yet is rendered as pending (what to run, the published values); its ``aliases``
        ({row: "<table>/<row>"}) show another table's runs as rows of this one
    configs : the config folder whose experiment groups declare a table's baseline, seeds and successor
        (:func:`~topklab.report.paired.table_groups`); a table whose group declares a baseline and has
        rows at several k also gets ``<table>_k.md``, the k sweep, rendered before any of its runs exist

    Examples
    --------
    >>> sorted(render_vision(read_results("results/vision", "vision"), []))  # doctest: +SKIP
    ['fmnistlt.md']
    """
    specs = {
        spec["vision_table"]: spec
        for paper in papers
        for spec in paper.values()
        if isinstance(spec, dict) and "vision_table" in spec
    }
    tables = by_table(results)
    for name, spec in specs.items():
        for alias, source in (spec.get("aliases") or {}).items():
            table, row = source.split("/")
            if row in tables.get(table, {}):
                tables.setdefault(name, {})[alias] = tables[table][row]
    groups = table_groups(configs, "vision")
    rendered = {
        f"{name.replace('/', '_')}.md": render_vision_table(name, tables[name], specs.get(name), groups.get(name))
        if name in tables
        else render_pending_table(name, specs[name])
        for name in sorted(set(tables) | set(specs))
    }
    for name, settings in sorted(groups.items()):
        if settings.get("baseline") and sweep_points(settings, {}, top1):
            rendered[f"{name}_k.md"] = render_sweep_table(name, tables.get(name, {}), settings, top1, "test top-1")
    return dict(sorted(rendered.items()))
