"""Paper tables from stored cells: the paper's value beside ours, the difference, whether ours lies
within the paper's std, and a paired Wilcoxon signed-rank test of STk against its baselines over
the same splits (beyond the paper)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import wilcoxon

from topklab.population.aggregates import USES_DELTA, USES_K
from topklab.utils.errors import TopklabError

AGGREGATE_NAMES = {"average": "Average", "maximum": "Maximum", "atk": "ATk", "matk": "MATk", "stk": "STk"}
METRIC_NAMES = {"error_pct": "test misclassification (%)", "rmse": "test RMSE"}
PAIRED_BASELINES = ("atk", "matk", "average")  # STk is tested against those of these a row has


@dataclass
class Line:
    dataset: str
    individual: str
    aggregate: str
    paper: tuple[float, float] | None
    ours: tuple[float, float] | None
    selected: dict | None

    @property
    def difference(self) -> float | None:
        return None if self.paper is None or self.ours is None else self.ours[0] - self.paper[0]

    @property
    def within_paper_std(self) -> bool | None:
        return None if self.difference is None else abs(self.difference) <= self.paper[1]


def paired_p_value(ours: list[float], baseline: list[float], what: str = "") -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired per-split metrics (1.0 if all equal).

    Examples
    --------
    >>> round(paired_p_value([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2.0, 3.0, 4.0, 5.0, 6.0, 7.5]), 4)
    0.0312
    """
    a, b = np.asarray(ours, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise TopklabError(f"paired test {what} needs the same splits on both sides, got {a.size} and {b.size} "
                           f"values; recompute the cells with one preset")
    if np.all(a == b):
        return 1.0
    return float(wilcoxon(a, b, zero_method="wilcox", alternative="two-sided").pvalue)


def build_lines(table: str, paper: dict, records: list[dict]) -> list[Line]:
    """One line per (dataset, individual, aggregate) of the paper's table, in the paper's order."""
    spec = paper[table]
    stored = {(r["cell"]["dataset"], r["cell"]["individual"], r["cell"]["aggregate"]): r
              for r in records if r["cell"]["table"] == table}
    lines = []
    for dataset, values in spec["rows"].items():
        for column, value in values.items():
            individual, aggregate = column.split("/")
            record = stored.get((dataset, individual, aggregate))
            lines.append(Line(
                dataset, individual, aggregate, tuple(value),
                None if record is None else (record["test_mean"], record["test_std"]),
                None if record is None else {k: v for k, v in record["selected"].items() if k != "index"},
            ))
    return lines


def paired_tests(table: str, records: list[dict]) -> list[dict]:
    """STk against each baseline of the row, per (dataset, individual): mean difference and p."""
    by_row: dict[tuple, dict] = {}
    for r in records:
        if r["cell"]["table"] == table:
            by_row.setdefault((r["cell"]["dataset"], r["cell"]["individual"]), {})[r["cell"]["aggregate"]] = r
    tests = []
    for (dataset, individual), cells in by_row.items():
        if "stk" not in cells:
            continue
        stk = cells["stk"]["per_split"]["test"]
        for baseline in PAIRED_BASELINES:
            if baseline in cells:
                other = cells[baseline]["per_split"]["test"]
                what = f"{table}/{dataset}/{individual}: stk vs {baseline}"
                if cells[baseline]["per_split"].get("split_seed") != cells["stk"]["per_split"].get("split_seed"):
                    raise TopklabError(f"paired test {what}: the cells used different splits; recompute with one preset")
                tests.append({"dataset": dataset, "individual": individual, "baseline": baseline,
                              "n": len(stk), "mean_difference": float(np.mean(stk) - np.mean(other)),
                              "stk_better": int(np.sum(np.asarray(stk) < np.asarray(other))),
                              "stk_worse": int(np.sum(np.asarray(stk) > np.asarray(other))),
                              "p": paired_p_value(stk, other, what)})
    return tests


def _num(value: float | None, digits: int, sign: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    value = 0.0 if abs(value) < 0.5 * 10.0 ** -digits else value  # no "-0.000"
    return f"{value:{sign}.{digits}f}"


def wtl(test: dict) -> str:
    ties = test["n"] - test["stk_better"] - test["stk_worse"]
    return f"{test['stk_better']}/{ties}/{test['stk_worse']}"


def _pm(pair, digits: int) -> str:
    return "—" if pair is None else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def _hyper(selected: dict | None, aggregate: str) -> str:
    if selected is None:
        return "—"
    keys = ["C", "lr"] + (["k"] if aggregate in USES_K else []) + (["delta"] if aggregate in USES_DELTA else [])
    names = {"C": "C", "lr": "η", "k": "k", "delta": "δ"}
    return ", ".join(f"{names[k]}={selected[k] if k == 'k' else format(selected[k], 'g')}" for k in keys)


def render_markdown(table: str, paper: dict, lines: list[Line], tests: list[dict], header: list[str]) -> str:
    spec = paper[table]
    digits = 3 if spec["metric"] == "error_pct" else 4
    out = [f"# {table.replace('table', 'Table ')}: {spec['caption']}", ""]
    out += [f"{h}  " for h in header] + [""]
    out += [f"Metric: {METRIC_NAMES[spec['metric']]}, mean ± std over splits. Δ = ours − paper; "
            "✓ = ours within the paper's std.", ""]
    out += ["| Dataset | Loss | Aggregate | Paper | Ours | Δ | ✓ | Selected |", "|---|---|---|---|---|---|---|---|"]
    for line in lines:
        mark = {True: "✓", False: "", None: "—"}[line.within_paper_std]
        out.append(f"| {line.dataset} | {line.individual} | {AGGREGATE_NAMES[line.aggregate]} | "
                   f"{_pm(line.paper, digits)} | {_pm(line.ours, digits)} | {_num(line.difference, digits)} | "
                   f"{mark} | {_hyper(line.selected, line.aggregate)} |")
    if tests:
        out += ["", "Paired Wilcoxon signed-rank test (two-sided) of STk against a baseline over the same splits "
                "(beyond the paper). Δ = mean(STk) − mean(baseline); W/T/L = splits where STk is better/tied/worse.", "",
                "| Dataset | Loss | STk vs | n | Δ | W/T/L | p |", "|---|---|---|---|---|---|---|"]
        for t in tests:
            out.append(f"| {t['dataset']} | {t['individual']} | {AGGREGATE_NAMES[t['baseline']]} | {t['n']} | "
                       f"{_num(t['mean_difference'], digits, '+')} | {wtl(t)} | {t['p']:.3g} |")
    return "\n".join(out) + "\n"


def _tex(text: str) -> str:
    return text.replace("_", r"\_").replace("%", r"\%")


def render_latex(table: str, paper: dict, lines: list[Line], tests: list[dict], header: list[str]) -> str:
    spec = paper[table]
    digits = 3 if spec["metric"] == "error_pct" else 4
    out = [f"% {h}" for h in header]
    out += [r"\begin{table}[t]", r"\centering", r"\small",
            rf"\caption{{{_tex(spec['caption'])}: paper vs.\ ours (mean $\pm$ std), $\Delta$ = ours $-$ paper, "
            r"\checkmark{} = within the paper's std.}",
            rf"\label{{tab:{table}}}", r"\begin{tabular}{lllllrc}", r"\toprule",
            r"Dataset & Loss & Aggregate & Paper & Ours & $\Delta$ & \\", r"\midrule"]
    for line in lines:
        mark = r"\checkmark" if line.within_paper_std else ""
        pm = (lambda p: "--" if p is None else f"${p[0]:.{digits}f} \\pm {p[1]:.{digits}f}$")
        out.append(f"{_tex(line.dataset)} & {_tex(line.individual)} & {AGGREGATE_NAMES[line.aggregate]} & "
                   f"{pm(line.paper)} & {pm(line.ours)} & {_num(line.difference, digits)} & {mark} \\\\")
    out += [r"\bottomrule", r"\end{tabular}"]
    if tests:
        out += [r"\par\medskip", r"\begin{tabular}{lllrrrr}", r"\toprule",
                r"Dataset & Loss & STk vs & $n$ & $\Delta$ & W/T/L & Wilcoxon $p$ \\", r"\midrule"]
        for t in tests:
            out.append(f"{_tex(t['dataset'])} & {_tex(t['individual'])} & {AGGREGATE_NAMES[t['baseline']]} & {t['n']} & "
                       f"{_num(t['mean_difference'], digits, '+')} & {wtl(t)} & {t['p']:.3g} \\\\")
        out += [r"\bottomrule", r"\end{tabular}"]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"
