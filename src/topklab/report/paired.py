"""Paired differences from a table's baseline, by seed, with a 95 % t-interval; and the k sweep.

A table's experiment group declares its baseline, its seed count and what supersedes it in the
``result`` block of its ``_common.yaml`` (``configs/experiment/<group>/_common.yaml``:
``result: {table: ..., baseline: <row>, seeds: <n>, superseded_by: <table>}``). The ``result`` block
says what a row's result is and where it is filed; a stored result drops it from its config, so these
keys never change a run's identity. The report reads the group's yaml files as written (no Hydra
composition): the rows are the group's yaml files not starting with ``_``, each row's aggregate is its
``override /loss`` and its k its ``loss.k``.

A row's difference from the baseline pairs the seeds both have, leaving out a diverged run on either
side (:mod:`topklab.report.divergence`); its interval is mean ± t₀.₉₇₅,ₙ₋₁ · sd / √n over the n pairs
(sd the sample standard deviation).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml
from scipy.stats import t as student_t

from topklab.report.divergence import diverged
from topklab.report.resumed import seed_of
from topklab.report.tracking import band_cell, hard_share_cell
from topklab.utils.errors import TopklabError

LEVEL = 0.95


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom, t₍₁₊ₗₑᵥₑₗ₎/₂,df.

    Examples
    --------
    >>> round(t_quantile(4), 3), round(t_quantile(1), 3), round(t_quantile(30), 3)
    (2.776, 12.706, 2.042)
    """
    return float(student_t.ppf((1 + level) / 2, df))


def t_interval(values, level: float = LEVEL) -> tuple[float, float | None]:
    """Mean and the half-width of its two-sided ``level`` t-interval (None for a single value).

    Parameters
    ----------
    values : the paired differences (at least one)

    Examples
    --------
    >>> mean, half = t_interval([-0.11, -0.12, 0.53, 0.14, 0.31])
    >>> round(mean, 3), round(half, 3)
    (0.15, 0.346)
    >>> t_interval([1.0])
    (1.0, None)
    """
    values = [float(v) for v in values]
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, t_quantile(len(values) - 1, level) * statistics.stdev(values) / math.sqrt(len(values))


def paired(baseline: list[dict], runs: list[dict], value) -> list[tuple[int, float]]:
    """``[(seed, value(run) − value(baseline run)), ...]`` over the seeds both have, by seed; a
    diverged run on either side, or a missing value, leaves its seed out.

    Examples
    --------
    >>> run = lambda seed, v: {"provenance": {"seeds": {"seed": seed}}, "result": {"summary": {"v": v}}}
    >>> paired([run(0, 1.0), run(1, 2.0)], [run(1, 2.5), run(2, 9.0)], lambda r: r["result"]["summary"]["v"])
    [(1, 0.5)]
    """
    base = {seed_of(r): value(r) for r in baseline if not diverged(r)}
    pairs = []
    for run in runs:
        seed = seed_of(run)
        if diverged(run) or base.get(seed) is None or value(run) is None:
            continue
        pairs.append((seed, value(run) - base[seed]))
    return sorted(pairs)


def signed(value: float) -> str:
    """A difference with its sign and a true minus.

    Examples
    --------
    >>> signed(0.15), signed(-0.114), signed(0.0)
    ('+0.15', '−0.11', '+0.00')
    """
    return f"{value:+.2f}".replace("-", "−")


def interval_cells(pairs: list[tuple[int, float]]) -> list[str]:
    """``[mean, 95 % interval, half-width, per seed]`` cells of a row's paired differences.

    Examples
    --------
    >>> interval_cells([(0, 1.0), (1, 3.0)])
    ['+2.00', '[−10.71, +14.71]', '12.71', '+1.00 (seed 0), +3.00 (seed 1)']
    >>> interval_cells([(0, 1.0)])[1:3]
    ['— (one seed)', '—']
    """
    mean, half = t_interval([d for _, d in pairs])
    per_seed = ", ".join(f"{signed(d)} (seed {s})" for s, d in pairs)
    if half is None:
        return [signed(mean), "— (one seed)", "—", per_seed]
    return [signed(mean), f"[{signed(mean - half)}, {signed(mean + half)}]", f"{half:.2f}", per_seed]


def paired_lines(
    present: list[str], rows: dict[str, list[dict]], labels: dict[str, str], baseline: str, value, what: str
) -> list[str]:
    """The table under a main table: each row's ``what`` minus the baseline's, paired by seed, with
    the mean, its 95 % t-interval and half-width, and the per-seed differences; nothing without the
    baseline's results.

    Examples
    --------
    >>> run = lambda seed, v: {"provenance": {"seeds": {"seed": seed}}, "result": {"summary": {"v": v}}}
    >>> rows = {"la": [run(0, 1.0), run(1, 2.0)], "stk": [run(0, 1.5), run(1, 2.0)]}
    >>> print(paired_lines(["la", "stk"], rows, {"la": "LA", "stk": "STk"}, "la", lambda r: r["result"]["summary"]["v"], "top-1")[-1])
    | STk | 2 | +0.25 | [−2.93, +3.43] | 3.18 | +0.50 (seed 0), +0.00 (seed 1) |
    """
    if baseline not in rows:
        return []
    lines = []
    for row in (r for r in present if r != baseline):
        pairs = paired(rows[baseline], rows[row], value)
        if pairs:
            lines.append(f"| {labels[row]} | {len(pairs)} | " + " | ".join(interval_cells(pairs)) + " |")
    if not lines:
        return []
    return [
        "",
        f"Paired by seed: {what} minus {labels[baseline]}'s over the seeds both rows have (a diverged run leaves its "
        "seed out): the mean, its 95 % t-interval (mean ± t₀.₉₇₅,ₙ₋₁ · sd / √n, sample sd) and half-width.",
        "",
        "| row | seeds | mean difference | 95 % interval | half-width | per seed |",
        "|---|---|---|---|---|---|",
        *lines,
    ]


def control_lines(
    controls: dict[str, list[str]], rows: dict[str, list[dict]], labels: dict[str, str], value, what: str
) -> list[str]:
    """The table of a group's controls (``_controls.yaml``: ``{row: [rows it is also paired with]}``): each
    control's ``what`` minus each row it controls, paired by seed as :func:`paired_lines` pairs with the
    baseline; a pair without results in both rows is left out.

    Examples
    --------
    >>> run = lambda seed, v: {"provenance": {"seeds": {"seed": seed}}, "result": {"summary": {"v": v}}}
    >>> rows = {"atk": [run(0, 2.0), run(1, 3.0)], "stk2": [run(0, 1.5), run(1, 3.0)]}
    >>> labels = {"atk": "ATk", "stk2": "STk at ATk's scale"}
    >>> print(control_lines({"stk2": ["atk"]}, rows, labels, lambda r: r["result"]["summary"]["v"], "top-1")[-1])
    | STk at ATk's scale | ATk | 2 | −0.25 | [−3.43, +2.93] | 3.18 | −0.50 (seed 0), +0.00 (seed 1) |
    """
    lines = []
    for row, against in controls.items():
        for other in against:
            pairs = paired(rows[other], rows[row], value) if row in rows and other in rows else []
            if pairs:
                lines.append(
                    f"| {labels[row]} | {labels[other]} | {len(pairs)} | " + " | ".join(interval_cells(pairs)) + " |"
                )
    if not lines:
        return []
    return [
        "",
        f"Controls, paired by seed with the rows they control: {what} of the control minus the other row's over the "
        "seeds both have, the mean, its 95 % t-interval (mean ± t₀.₉₇₅,ₙ₋₁ · sd / √n, sample sd) and half-width.",
        "",
        "| control | against | seeds | mean difference | 95 % interval | half-width | per seed |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]


def table_groups(configs: Path | None, folder: str) -> dict[str, dict]:
    """``{table: settings}`` for every experiment group whose ``_common.yaml`` files its rows into a
    table under ``results/<folder>/``, read from the yaml files as written: ``{"group", "controls", "baseline",
    "seeds", "superseded_by", "rows": {row: {"label", "loss", "k"}}}`` (empty when ``configs`` is None);
    ``controls`` from the group's ``_controls.yaml`` ({} without one).

    Examples
    --------
    >>> table_groups(Path("configs"), "vision")["fmnistlt_full"]["baseline"]  # doctest: +SKIP
    'la'
    >>> table_groups(Path("configs"), "vision")["fmnistlt"]["superseded_by"]  # doctest: +SKIP
    'fmnistlt_full'
    >>> table_groups(None, "vision")
    {}
    """
    if configs is None:
        return {}
    root = configs / "experiment"
    groups = {}
    for common in sorted(root.rglob("_common.yaml")):
        block = (yaml.safe_load(common.read_text()) or {}).get("result") or {}
        if not block.get("table") or (block.get("folder") or block.get("family")) != folder:
            continue
        rows = {}
        for path in sorted(common.parent.glob("*.yaml")):
            if path.name.startswith("_"):
                continue
            spec = yaml.safe_load(path.read_text()) or {}
            overrides = [d for d in spec.get("defaults", []) if isinstance(d, dict) and "override /loss" in d]
            rows[path.stem] = {
                "label": spec.get("row") or path.stem,
                "loss": overrides[0]["override /loss"] if overrides else None,
                "k": (spec.get("loss") or {}).get("k"),
            }
        controls_file = common.with_name("_controls.yaml")
        controls = (yaml.safe_load(controls_file.read_text()) or {}) if controls_file.exists() else {}
        unknown = sorted({r for row, against in controls.items() for r in [row, *against]} - set(rows))
        if unknown:
            raise TopklabError(f"{controls_file} names rows its group lacks: {', '.join(unknown)}")
        groups[block["table"]] = {
            "group": common.parent.relative_to(root).as_posix(),
            "controls": controls,
            "baseline": block.get("baseline"),
            "seeds": block.get("seeds"),
            "superseded_by": block.get("superseded_by"),
            "rows": rows,
        }
    return groups


def with_gpu_table(group: str, tables) -> list[str]:
    """A group's table and, when its runs on a GPU are stored (filed as ``<table>_cuda``), that table too.

    Examples
    --------
    >>> with_gpu_table("multi30k", ["multi30k", "multi30k_cuda", "iwslt14"])
    ['multi30k', 'multi30k_cuda']
    """
    return [group, *(t for t in tables if t == f"{group}_cuda")]


def row_order(settings: dict | None) -> list[str]:
    """A group's rows in reading order: the baseline first, then each series (the label before
    ``", k/n = "``) by increasing k.

    Examples
    --------
    >>> row_order({"baseline": "la", "rows": {"a9": {"label": "LA + ATk, k/n = 0.9", "k": 0.9},
    ...     "a5": {"label": "LA + ATk, k/n = 0.5", "k": 0.5}, "la": {"label": "LA", "k": None}}})
    ['la', 'a5', 'a9']
    """
    if not settings:
        return []
    rows = settings["rows"]

    def key(row: str) -> tuple:
        k = rows[row].get("k")
        return (
            row != settings.get("baseline"),
            rows[row]["label"].split(", k/n = ")[0],
            k if isinstance(k, float) else 0.0,
            row,
        )

    return sorted(rows, key=key)


def _seed_list(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def missing_runs(settings: dict, rows: dict[str, list[dict]]) -> list[str]:
    """Each configured row with seeds still to run (of ``range(settings["seeds"])``, or the rows without
    any result when no seed count is declared), as ``<row> (seeds …)``.

    Examples
    --------
    >>> run = lambda seed: {"provenance": {"seeds": {"seed": seed}}}
    >>> missing_runs({"seeds": 3, "rows": {"la": {}, "stk": {}}}, {"la": [run(0), run(2)]})
    ['`la` (seed 1)', '`stk` (seeds 0, 1, 2)']
    """
    expected = list(range(settings["seeds"])) if settings.get("seeds") else None
    missing = []
    for row in settings["rows"]:
        have = {seed_of(r) for r in rows.get(row, [])}
        if expected is None:
            if not have:
                missing.append(f"`{row}`")
            continue
        left = [s for s in expected if s not in have]
        if left:
            missing.append(f"`{row}` (seed{'s' if len(left) > 1 else ''} {_seed_list(left)})")
    return missing


def sweep_points(settings: dict, rows: dict[str, list[dict]], value) -> dict[str, list[dict]]:
    """``{series: [{"row", "k", "pairs", "runs"}, ...]}``: the group's rows that set a fractional k and
    another loss than the baseline's, by series (the row label before ``", k/n = "``, e.g. "LA + STk")
    and k; ``pairs`` their differences from the baseline (:func:`paired`, empty without results). A
    series at one k only (a row beside the sweep, such as a flagged variant) is no sweep and is left out.

    Examples
    --------
    >>> settings = {"baseline": "la", "rows": {"la": {"label": "LA", "loss": "average", "k": None},
    ...     "s9": {"label": "LA + STk, k/n = 0.9", "loss": "stk", "k": 0.9},
    ...     "s5": {"label": "LA + STk, k/n = 0.5", "loss": "stk", "k": 0.5}}}
    >>> settings["rows"]["v"] = {"label": "LA + STk (λ₀ = 0), k/n = 0.9", "loss": "stk", "k": 0.9}
    >>> {name: [(p["row"], p["k"]) for p in points] for name, points in sweep_points(settings, {}, None).items()}
    {'LA + STk': [('s5', 0.5), ('s9', 0.9)]}
    """
    baseline = settings["baseline"]
    base_loss = settings["rows"].get(baseline, {}).get("loss")
    series: dict[str, list[dict]] = {}
    for row, spec in settings["rows"].items():
        k = spec.get("k")
        if row == baseline or spec.get("loss") == base_loss or not isinstance(k, float) or not 0 < k < 1:
            continue
        runs = rows.get(row, [])
        pairs = paired(rows[baseline], runs, value) if baseline in rows and runs else []
        name = spec["label"].split(", k/n = ")[0]
        series.setdefault(name, []).append({"row": row, "k": k, "pairs": pairs, "runs": runs})
    return {
        name: sorted(points, key=lambda p: p["k"])
        for name, points in series.items()
        if len({p["k"] for p in points}) > 1
    }


def render_sweep_table(name: str, rows: dict[str, list[dict]], settings: dict, value, what: str) -> str:
    """Markdown for the k sweep of a table whose group declares a baseline: per series and k, the
    difference from the baseline paired by seed with its 95 % interval, and λ in band per row; the
    header lists the rows and seeds not yet run.

    Parameters
    ----------
    name : the table id
    rows : ``{row: [result, ...]}`` of that table (may be empty)
    settings : the table's entry of :func:`table_groups`
    value : a result's value (e.g. its selected test top-1)
    what : the value's name in the header
    """
    baseline = settings["baseline"]
    base_label = settings["rows"][baseline]["label"]
    group = settings["group"]
    points = sweep_points(settings, rows, value)
    seeds = settings.get("seeds")
    lines = [f"# {name}: the k sweep, {what} minus {base_label}'s paired by seed", ""]
    missing = missing_runs(settings, rows)
    if missing:
        lines += [
            f"**Still missing** ({f'{seeds} seeds per row, ' if seeds else ''}"
            f"`python scripts/run_sweep.py '{group}/*'` runs them, then `make tables`): {', '.join(missing)}.",
            "",
        ]
    lines += [
        f"Each row: `python train.py experiment={group}/<row> seed=<k>`. A difference pairs the seeds the row and "
        f"{base_label} both have (a diverged run leaves its seed out); the interval is the mean ± t₀.₉₇₅,ₙ₋₁ · sd / √n "
        "(sample sd). λ in band: the share of a run's training steps at which λ tracked the batch's k-th largest "
        "loss, mean ± population sd (ddof 0) over the row's n seeds; hard share > λ: the share of the last epoch's "
        "losses above λ, the same (1.000: λ below every loss, no sample dropped).",
        "",
        "| series | k/n | row | seeds | mean difference | 95 % interval | half-width | per seed | λ in band | hard share > λ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for series, entries in points.items():
        for p in entries:
            summaries = [r["result"]["summary"] for r in p["runs"]]
            band, hard = (band_cell(summaries), hard_share_cell(summaries)) if p["runs"] else ("—", "—")
            cells = interval_cells(p["pairs"]) if p["pairs"] else ["not run" if not p["runs"] else "—", "—", "—", "—"]
            lines.append(
                f"| {series} | {p['k']:g} | `{p['row']}` | {len(p['pairs'])} | "
                + " | ".join(cells)
                + f" | {band} | {hard} |"
            )
    return "\n".join(lines) + "\n"
