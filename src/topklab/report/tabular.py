"""STk Tables 3, 4 and 6 from the tabular cells (``results/tabular/<preset>/``): the paper's value
beside ours, the difference, whether ours lies within the paper's std, and a paired Wilcoxon
signed-rank test of STk against its baselines over the same splits (beyond the paper)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t
from scipy.stats import wilcoxon

from topklab.config import aggregate_config
from topklab.losses.aggregate.lambda_monitor import FLAG_BELOW, PARTLY_BELOW
from topklab.report.schema import code_versions
from topklab.utils.errors import TopklabError

TABLES = ("table3", "table4", "table6")
PAPER_PRESET = "full"  # the paper's protocol: its tables are results/tables/table{3,4,6}.*; other presets' get a suffix
METRIC_NAMES = {"error_pct": "test misclassification (%)", "rmse": "test RMSE"}
PAIRED_BASELINES = ("atk", "matk", "average")  # STk is tested against those of these a row has
HYPER_NAMES = {"C": "C", "lr": "η", "k": "k", "delta": "δ"}  # grid axes, in the order printed


def aggregate_label(name: str) -> str:
    """An aggregate's name in the tables: its class's, as its loss config ``configs/loss/<name>.yaml``
    names it in ``_target_`` (a new aggregate's class and yaml are all a table needs).

    Examples
    --------
    >>> aggregate_label("stk"), aggregate_label("average")
    ('STk', 'Average')
    """
    return aggregate_config(name)._target_.rpartition(".")[2]


@dataclass
class Line:
    """One (dataset, loss, aggregate) line of a table: the paper's and our (mean, std), the
    hyperparameters selected for ours and the grid axes that were searched."""

    dataset: str
    individual: str
    aggregate: str
    paper: tuple[float, float] | None
    ours: tuple[float, float] | None
    selected: dict | None
    searched: tuple[str, ...] = ()
    ties: dict | None = None
    sample_std: float | None = None
    in_band: float | None = None  # λ in band over split 0's retraining (results/bench/lambda_band_cpu.json)

    @property
    def difference(self) -> float | None:
        return None if self.paper is None or self.ours is None else self.ours[0] - self.paper[0]

    @property
    def within_paper_std(self) -> bool | None:
        return None if self.difference is None else abs(self.difference) <= self.paper[1]


def searched_axes(combos: dict) -> tuple[str, ...]:
    """Grid axes on which a cell's combinations differ (compared as JSON, so k=1 and k=1.0 differ).

    Examples
    --------
    >>> searched_axes({"C": [1.0, 10.0], "lr": [0.1, 0.1], "k": [1, 1.0], "delta": [0.1, 0.1]})
    ('C', 'k')
    """
    return tuple(axis for axis in HYPER_NAMES if len({json.dumps(v) for v in combos[axis]}) > 1)


def cell_ties(cell: dict) -> dict:
    """The combinations tied with the selected one: the cell's own record, or, for a cell stored
    before ties were recorded, those whose stored mean validation metric (rounded to 1e-6) is within
    2e-6 of the selected one's.

    Examples
    --------
    >>> cell_ties({"selected": {"index": 0}, "combos": {"val_mean": [1.0, 1.000001, 2.0], "test_mean": [5.0, 7.0, 1.0]}})["count"]
    2
    """
    if "ties" in cell:
        return cell["ties"]
    means, tests = (np.asarray(cell["combos"][key], dtype=float) for key in ("val_mean", "test_mean"))
    tied = np.flatnonzero(np.abs(means - means[cell["selected"]["index"]]) <= 2e-6)
    return {
        "rule": "first in grid order (stored means rounded to 1e-6)",
        "count": int(len(tied)),
        "indices": tied.tolist(),
        "test_min": float(tests[tied].min()),
        "test_max": float(tests[tied].max()),
        "test_mean": float(tests[tied].mean()),
    }


def paired_p_value(ours: list[float], baseline: list[float], what: str = "") -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired per-split metrics (1.0 if all equal).

    Examples
    --------
    >>> round(paired_p_value([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2.0, 3.0, 4.0, 5.0, 6.0, 7.5]), 4)
    0.0312
    """
    a, b = np.asarray(ours, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise TopklabError(
            f"paired test {what} needs the same splits on both sides, got {a.size} and {b.size} "
            f"values; recompute the cells with one preset"
        )
    if np.all(a == b):
        return 1.0
    return float(wilcoxon(a, b, zero_method="wilcox", alternative="two-sided").pvalue)


def _cells(table: str, results: list[dict]) -> dict[tuple, dict]:
    """``{(dataset, individual, aggregate): payload}`` of one table's cells."""
    return {
        (p["cell"]["dataset"], p["cell"]["individual"], p["cell"]["aggregate"]): p
        for p in (r["result"] for r in results)
        if p["cell"]["table"] == table
    }


def build_lines(table: str, paper: dict, results: list[dict], band: dict | None = None) -> list[Line]:
    """One line per (dataset, individual, aggregate) of the paper's table, in the paper's order;
    ``band``: λ in band per cell file (``table3/<dataset>/<individual>-<aggregate>.json``)."""
    stored = _cells(table, results)
    band = band or {}
    lines = []
    for dataset, values in paper[table]["rows"].items():
        for column, value in values.items():
            individual, aggregate = column.split("/")
            cell = stored.get((dataset, individual, aggregate))
            lines.append(
                Line(
                    dataset,
                    individual,
                    aggregate,
                    tuple(value),
                    None if cell is None else (cell["test_mean"], cell["test_std"]),
                    None if cell is None else cell["selected"],
                    () if cell is None else searched_axes(cell["combos"]),
                    None if cell is None else cell_ties(cell),
                    None
                    if cell is None or len(cell["per_split"]["test"]) < 2
                    else statistics.stdev(cell["per_split"]["test"]),
                    band.get(f"{table}/{dataset}/{individual}-{aggregate}.json"),
                )
            )
    return lines


def below_band(share: float | None) -> bool:
    """Whether a MATk/STk cell's λ was in band on fewer than :data:`PARTLY_BELOW` of its steps (None: k = n,
    or no record)."""
    return share is not None and share < PARTLY_BELOW


def band_mark(line: Line) -> str:
    """ " †" on a MATk/STk line whose λ was in band on fewer than :data:`PARTLY_BELOW` of its steps."""
    return " †" if below_band(line.in_band) else ""


def _tex_mark(line: Line) -> str:
    return r"$^\dagger$" if band_mark(line) else ""


def band_note(shares: dict[str, float | None], retrained: str) -> str | None:
    """The † footnote naming every entry of ``{name: λ in band}`` below :data:`PARTLY_BELOW` with its share
    (below :data:`FLAG_BELOW`: "not STk"), or None when none is; ``retrained``: what the band file retrained.

    Examples
    --------
    >>> band_note({"a": 0.95, "b": 0.6, "c": 0.1}, "repeat 0")[-30:]
    'so): b 0.60, c 0.10 (not STk).'
    >>> band_note({"a": 0.95, "k = n": None}, "repeat 0") is None
    True
    """
    marked = {name: share for name, share in shares.items() if below_band(share)}
    if not marked:
        return None
    named = ", ".join(
        f"{name} {share:.2f}" + (" (not STk)" if share < FLAG_BELOW else "") for name, share in marked.items()
    )
    return (
        f"† λ in band on fewer than {PARTLY_BELOW:.0%} of the steps when {retrained} is retrained "
        f"(`results/bench/lambda_band_cpu.md`; below {FLAG_BELOW:.0%}: the row is not STk, only named so): {named}."
    )


def band_footnote(lines: list[Line]) -> str | None:
    """The footnote naming the marked lines (:func:`band_mark`) with their shares, or None."""
    return band_note(
        {f"{line.dataset} {line.individual} {aggregate_label(line.aggregate)}": line.in_band for line in lines},
        "split 0's selected setting",
    )


def paired_tests(table: str, results: list[dict]) -> list[dict]:
    """STk against each baseline of the row, per (dataset, individual): mean difference and p."""
    by_row: dict[tuple, dict] = {}
    for (dataset, individual, aggregate), cell in _cells(table, results).items():
        by_row.setdefault((dataset, individual), {})[aggregate] = cell["per_split"]
    tests = []
    for (dataset, individual), cells in by_row.items():
        if "stk" not in cells:
            continue
        stk = cells["stk"]["test"]
        for baseline in (b for b in PAIRED_BASELINES if b in cells):
            other = cells[baseline]["test"]
            what = f"{table}/{dataset}/{individual}: stk vs {baseline}"
            if cells[baseline].get("split_seed") != cells["stk"].get("split_seed"):
                raise TopklabError(f"paired test {what}: the cells used different splits; recompute with one preset")
            tests.append(
                {
                    "dataset": dataset,
                    "individual": individual,
                    "baseline": baseline,
                    "n": len(stk),
                    "mean_difference": float(np.mean(stk) - np.mean(other)),
                    "stk_better": int(np.sum(np.asarray(stk) < np.asarray(other))),
                    "stk_worse": int(np.sum(np.asarray(stk) > np.asarray(other))),
                    "p": paired_p_value(stk, other, what),
                }
            )
    return tests


def corrected_t_test(ours, other, test_over_train: float) -> tuple[float, float]:
    """Nadeau and Bengio's corrected resampled t-test of paired per-split metrics (Machine Learning 52, 2003):
    t = mean(d) / √((1/J + n_test/n_train)·s²) over J random splits, s² the sample variance of the differences d,
    J − 1 degrees of freedom; returns ``(t, two-sided p)``. The correction widens the plain paired t-test, whose
    splits share most of their training data and so are not independent. Equal metrics give (0, 1).

    Examples
    --------
    >>> t, p = corrected_t_test([1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 1.0, 1.5], test_over_train=0.5)
    >>> round(t, 3), round(p, 3)
    (3.13, 0.052)
    """
    ours, other = np.asarray(ours, dtype=float), np.asarray(other, dtype=float)
    if ours.size != other.size or ours.size < 2:
        raise TopklabError(
            f"a corrected t-test needs the same J >= 2 splits on both sides, got {ours.size} and {other.size}"
        )
    d = ours - other
    variance = float(d.var(ddof=1))
    if variance == 0.0:
        return (0.0, 1.0) if d.mean() == 0.0 else (math.copysign(math.inf, d.mean()), 0.0)
    t = float(d.mean()) / math.sqrt((1.0 / d.size + test_over_train) * variance)
    return t, float(2.0 * student_t.sf(abs(t), d.size - 1))


LAMBDA_AGGREGATES = ("matk", "stk")  # the cells with a λ, which a preset with another λ rule retrains
AGAINST = (("paper", "the paper's update"), ("average", "Average"), ("atk", "ATk"))


def against_reference(table: str, results: list[dict], reference: list[dict]) -> list[dict]:
    """Each MATk/STk cell of ``results`` (a preset with another λ rule, e.g. ``full_solve``) against the
    ``reference`` preset's cells on the same splits (``full``: the paper's update, Average and ATk), by
    :func:`corrected_t_test`, with where its λ sat: the mean over splits of ``hard_share`` and
    ``lam_minus_kth``. A pair on other splits is left out."""
    mine, theirs = _cells(table, results), _cells(table, reference)
    rows = []
    for (dataset, individual, aggregate), cell in sorted(mine.items()):
        if aggregate not in LAMBDA_AGGREGATES:
            continue
        splits = cell["per_split"]
        for key, label in AGAINST:
            other = theirs.get((dataset, individual, aggregate if key == "paper" else key))
            if other is None or other["per_split"].get("split_seed") != splits.get("split_seed"):
                continue
            sizes = cell["data"]["sizes"]  # train, validation, test
            t, p = corrected_t_test(splits["test"], other["per_split"]["test"], sizes[2] / sizes[0])
            rows.append(
                {
                    "dataset": dataset,
                    "individual": individual,
                    "aggregate": aggregate,
                    "against": label,
                    "n": len(splits["test"]),
                    "mean_difference": float(np.mean(splits["test"]) - np.mean(other["per_split"]["test"])),
                    "t": t,
                    "p": p,
                    "hard_share": _mean_or_none(splits.get("hard_share")),
                    "lam_minus_kth": _mean_or_none(splits.get("lam_minus_kth")),
                }
            )
    return rows


def _mean_or_none(values) -> float | None:
    return None if not values else float(np.mean(values))


def against_lines(rows: list[dict], digits: int, reference: str) -> list[str]:
    """The Markdown section of :func:`against_reference` (none without rows)."""
    if not rows:
        return []
    out = [
        "",
        f"Against the `{reference}` preset's cells on the same splits: Δ = mean(this cell) − mean(that cell) of the "
        "test metric, and Nadeau and Bengio's corrected resampled t-test (t over √((1/J + n_test/n_train)·s²), J − 1 "
        "degrees of freedom; two-sided p, uncorrected for the number of rows). Hard share: the share of a split's "
        "training losses above its λ at the reported state, mean over splits (1.000: λ below every loss); "
        "λ − ℓ_[k]: the same split's λ minus its k-th largest training loss, mean over splits.",
        "",
        "| Dataset | Loss | Aggregate | against | n | Δ | t | p | hard share | λ − ℓ_[k] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['dataset']} | {r['individual']} | {aggregate_label(r['aggregate'])} | {r['against']} | {r['n']} | "
            f"{_num(r['mean_difference'], digits, '+')} | {r['t']:.2f} | {r['p']:.3g} | "
            f"{_num(r['hard_share'], 3)} | {_num(r['lam_minus_kth'], 4, '+')} |"
        )
    return out


def header(preset: str, table: str, results: list[dict], lines: list[Line]) -> list[str]:
    """The lines above a table: preset, splits, code, commands, agreement with the paper, ties, time, missing cells."""
    mine = [r for r in results if r["result"]["cell"]["table"] == table]
    if not mine:
        return [f"Preset `{preset}`: no cells of this table yet."]
    commands = sorted({r["command"] for r in mine})
    splits = sorted({len(r["result"]["per_split"]["test"]) for r in mine})
    missing = [f"{x.dataset}/{x.individual}/{x.aggregate}" for x in lines if x.ours is None]
    within = [x.within_paper_std for x in lines if x.within_paper_std is not None]
    tied = [x for x in lines if x.ties is not None and x.ties["count"] > 1]
    spread = max((x.ties["test_max"] - x.ties["test_min"] for x in tied), default=0.0)
    out = [
        f"Preset `{preset}`: {', '.join(map(str, splits))} splits per cell; code {code_versions(mine)}.",
        f"Produced by: {'; '.join(f'`{c}`' for c in commands)}, then `make tables`.",
        f"Ours within the paper's std: {sum(within)} of {len(within)} cells.",
        "Selection: the lowest validation score over the splits, compared exactly (error tables: the total number of "
        "validation errors; RMSE: the mean, equal within 1e-9 relative); a tie goes to the first combination in grid "
        "order (k, then C, η, δ, each in the preset's order, so k = 1 first). Tied = combinations with "
        f"the selected score and their range of test means: {len(tied)} of {sum(x.ties is not None for x in lines)} "
        f"cells tied, the widest test range {spread:.3g}.",
    ]
    seconds = sum(r["result"]["seconds"] for r in mine)
    longest = max(mine, key=lambda r: r["result"]["seconds"])
    out.append(
        f"Time: {seconds:,.0f} s of cell time over {len(mine)} cells ({seconds / 3600:.2f} h; each cell's training "
        f"wall clock, summed), the longest {longest['result']['seconds']:,.0f} s "
        f"({'/'.join(longest['result']['cell'][k] for k in ('dataset', 'individual', 'aggregate'))})."
    )
    if missing:
        out.append(f"Missing cells ({len(missing)}): {', '.join(missing)}.")
    return out


def _num(value: float | None, digits: int, sign: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    value = 0.0 if abs(value) < 0.5 * 10.0**-digits else value  # no "-0.000"
    return f"{value:{sign}.{digits}f}"


def _wtl(test: dict) -> str:
    ties = test["n"] - test["stk_better"] - test["stk_worse"]
    return f"{test['stk_better']}/{ties}/{test['stk_worse']}"


def _pm(pair, digits: int) -> str:
    return "—" if pair is None else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def _hyper(line: Line) -> str:
    if line.selected is None:
        return "—"
    return ", ".join(
        f"{HYPER_NAMES[k]}={line.selected[k] if k == 'k' else format(line.selected[k], 'g')}" for k in line.searched
    )


def _tied(line: Line, digits: int) -> str:
    if line.ties is None:
        return "—"
    if line.ties["count"] == 1:
        return "1"
    return f"{line.ties['count']} ({line.ties['test_min']:.{digits}f}–{line.ties['test_max']:.{digits}f})"


def render_markdown(
    table: str, paper: dict, lines: list[Line], tests: list[dict], head: list[str], against: list[str] = ()
) -> str:
    """The table as Markdown: one row per line, then the paired tests and ``against`` (:func:`against_lines`)."""
    spec = paper[table]
    digits = 3 if spec["metric"] == "error_pct" else 4
    out = [f"# {table.replace('table', 'Table ')}: {spec['caption']}", ""]
    out += [f"{h}  " for h in head] + [""]
    out += [
        f"Metric: {METRIC_NAMES[spec['metric']]}. Paper: mean ± std over its 50 splits (which sd, the paper does "
        "not say; read here as the population sd). Ours: mean ± population sd (ddof 0) over the preset's n splits "
        "(above); s: the sample sd (ddof 1). Δ = ours − paper; ✓ = ours within the paper's std.",
        "",
    ]
    out += [
        "| Dataset | Loss | Aggregate | Paper | Ours | s | Δ | ✓ | Selected | Tied (test range) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        mark = {True: "✓", False: "", None: "—"}[line.within_paper_std]
        out.append(
            f"| {line.dataset} | {line.individual} | {aggregate_label(line.aggregate)}{band_mark(line)} | "
            f"{_pm(line.paper, digits)} | {_pm(line.ours, digits)} | {_num(line.sample_std, digits)} | "
            f"{_num(line.difference, digits)} | "
            f"{mark} | {_hyper(line)} | {_tied(line, digits)} |"
        )
    footnote = band_footnote(lines)
    if footnote:
        out += ["", footnote]
    if tests:
        out += [
            "",
            "Paired Wilcoxon signed-rank test (two-sided) of STk against a baseline over the same splits "
            "(beyond the paper). Δ = mean(STk) − mean(baseline); W/T/L = splits where STk is better/tied/worse.",
            "",
            "| Dataset | Loss | STk vs | n | Δ | W/T/L | p |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in tests:
            out.append(
                f"| {t['dataset']} | {t['individual']} | {aggregate_label(t['baseline'])} | {t['n']} | "
                f"{_num(t['mean_difference'], digits, '+')} | {_wtl(t)} | {t['p']:.3g} |"
            )
    out += against
    return "\n".join(out) + "\n"


def _tex(text: str) -> str:
    return text.replace("_", r"\_").replace("%", r"\%")


def _tex_pm(pair, digits: int) -> str:
    return "--" if pair is None else f"${pair[0]:.{digits}f} \\pm {pair[1]:.{digits}f}$"


def render_latex(table: str, paper: dict, lines: list[Line], tests: list[dict], head: list[str]) -> str:
    """The table as a LaTeX ``table`` float (booktabs), the header as comments."""
    spec = paper[table]
    digits = 3 if spec["metric"] == "error_pct" else 4
    out = [f"% {h}" for h in head]
    out += [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{_tex(spec['caption'])}: paper vs.\ ours (mean $\pm$ std), $\Delta$ = ours $-$ paper, "
        r"\checkmark{} = within the paper's std.}",
        rf"\label{{tab:{table}}}",
        r"\begin{tabular}{lllllrc}",
        r"\toprule",
        r"Dataset & Loss & Aggregate & Paper & Ours & $\Delta$ & \\",
        r"\midrule",
    ]
    for line in lines:
        mark = r"\checkmark" if line.within_paper_std else ""
        out.append(
            f"{_tex(line.dataset)} & {_tex(line.individual)} & {aggregate_label(line.aggregate)}{_tex_mark(line)} & "
            f"{_tex_pm(line.paper, digits)} & {_tex_pm(line.ours, digits)} & {_num(line.difference, digits)} & "
            f"{mark} \\\\"
        )
    out += [r"\bottomrule", r"\end{tabular}"]
    footnote = band_footnote(lines)
    if footnote:
        out += [r"\par\smallskip", r"{\footnotesize " + _tex(footnote.replace("†", "$^\\dagger$")) + "}"]
    if tests:
        out += [
            r"\par\medskip",
            r"\begin{tabular}{lllrrrr}",
            r"\toprule",
            r"Dataset & Loss & STk vs & $n$ & $\Delta$ & W/T/L & Wilcoxon $p$ \\",
            r"\midrule",
        ]
        for t in tests:
            out.append(
                f"{_tex(t['dataset'])} & {_tex(t['individual'])} & {aggregate_label(t['baseline'])} & {t['n']} & "
                f"{_num(t['mean_difference'], digits, '+')} & {_wtl(t)} & {t['p']:.3g} \\\\"
            )
        out += [r"\bottomrule", r"\end{tabular}"]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def table_stem(table: str, preset: str) -> str:
    """``table3`` for the paper's protocol (``full``), ``table3_<preset>`` for the others.

    Examples
    --------
    >>> table_stem("table3", "full"), table_stem("table3", "fraction")
    ('table3', 'table3_fraction')
    """
    return table if preset == PAPER_PRESET else f"{table}_{preset}"


def render_tabular(
    preset: str,
    paper: dict,
    results: list[dict],
    band: dict | None = None,
    tables: tuple[str, ...] = TABLES,
    reference: list[dict] | None = None,
) -> dict[str, str]:
    """``{"table3.md": text, "table3.tex": text, ...}`` for Tables 3, 4 and 6 from one preset's cells
    (``table3_<preset>.md`` ... for a preset other than ``full``).

    Parameters
    ----------
    preset : name of the preset the cells come from (printed in the header)
    paper : ``results/paper/stk_neurips2024.yaml`` loaded
    results : the preset's tabular results (``read_results(results/"tabular"/preset, "tabular")``)
    band : λ in band per cell file of this preset (:func:`band_of`), marking the cells below 0.9
    tables : which of Tables 3, 4 and 6 (each renders alone; the paired tests make Tables 3 and 4 the slow ones)
    reference : the ``full`` preset's cells, for a preset that retrains only the MATk/STk cells with another λ
        rule (``lam_update``): each of its cells against the reference's on the same splits (:func:`against_reference`)

    Examples
    --------
    >>> render_tabular("fraction", paper, cells)["table3.md"].splitlines()[0]  # doctest: +SKIP
    '# Table 3: Misclassification rate (%) with the logistic individual loss'
    """
    rendered = {}
    for table in tables:
        lines = build_lines(table, paper, results, band)
        tests = paired_tests(table, results)
        head = header(preset, table, results, lines)
        digits = 3 if paper[table]["metric"] == "error_pct" else 4
        against = against_lines(against_reference(table, results, reference or []), digits, PAPER_PRESET)
        rendered[f"{table_stem(table, preset)}.md"] = render_markdown(table, paper, lines, tests, head, against)
        rendered[f"{table_stem(table, preset)}.tex"] = render_latex(table, paper, lines, tests, head)
    return rendered


def band_of(stored: dict | None, preset: str) -> dict:
    """``{cell file: λ in band}`` from the stored ``results/bench/lambda_band_cpu.json`` (its cells are the
    ``full`` preset's; other presets and a missing file have none)."""
    if stored is None or preset != PAPER_PRESET:
        return {}
    return {row["row"]: row["in_band"] for row in stored["result"]["rows"] if row.get("family") == "tabular"}
