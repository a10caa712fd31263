"""Markdown for STk Tables 1 and 2 from ``results/synthetic/table{1,2}.json`` beside the paper."""
from __future__ import annotations

import statistics


def _git(result: dict) -> str:
    return str((result.get("provenance") or {}).get("git", {}).get("sha", "?"))[:10]


def render_table1(result: dict, paper: dict) -> str:
    rows = paper["table1"]["rows"]
    lines = [f"# Table 1: {paper['table1']['caption']}", "",
             f"Ours: n = {result['n']}, k = {result['k']}, {result['runs']} runs on the same samples for every "
             f"algorithm, {result['threads']} torch thread; code {_git(result)}.",
             f"Produced by: `{result['command']}`, then `python scripts/make_tables.py`.", "",
             "| Algorithm | how it runs here | paper (s) | ours (s) | ours / paper | λ iterations |",
             "|---|---|---|---|---|---|"]
    for name in result["order"]:
        row = result["algorithms"][name]
        published = rows.get(name)
        paper_cell = f"{published[0]:.4g} ± {published[1]:.2g}" if published else "—"
        ratio = f"{row['mean'] / published[0]:.3g}" if published else "—"
        iterations = (f"{statistics.fmean(row['iterations']):.0f} (max {max(row['iterations'])})"
                      if row["iterations"] else "—")
        lines.append(f"| {name} | {row['level']} | {paper_cell} | {row['mean']:.4g} ± {row['std']:.2g} | {ratio} | "
                     f"{iterations} |")
    return "\n".join(lines) + "\n"


def mean_std(values) -> tuple[float, float]:
    """Mean and population std (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


def render_table2(result: dict, paper: dict) -> str:
    published = paper["table2"]["rows"]
    config = result["config"]
    columns = result["columns"]
    names = result["order"]
    repeats = len(next(iter(columns.values()))["test_acc"])
    lines = [f"# Table 2: {paper['table2']['caption']}", "",
             f"Ours: {repeats} repeats, covariance `{config['task']['covariance']}`, l1 = {config['trainer']['l1']}, "
             f"k from {config['k_grid']} by validation accuracy, λ init `{config['trainer']['lam_init']}`, "
             f"support tolerance {config['support_tol']}; Bayes accuracy on the balanced test set "
             f"{result['bayes_accuracy_balanced_test']:.1f}%; code {_git(result)}.",
             f"Produced by: `{result['command']}`, then `python scripts/make_tables.py`.",
             "Time: seconds per model of the plain single-model loop (mean over "
             f"{config['time_repeats']} repeats at the selected k); the paper's hardware is not given.", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def row(label, key, values_of, fmt):
        paper_row = published[key]
        lines.append(f"| {label}, paper | " + " | ".join(fmt(paper_row[n]) if n in paper_row else "—" for n in names) + " |")
        lines.append(f"| {label}, ours | " + " | ".join(
            "{} ± {}".format(*(fmt(v) for v in mean_std(values_of(columns[n])))) for n in names) + " |")

    row("Accuracy (%)", "accuracy_pct", lambda c: c["test_acc"], lambda v: f"{v:.2f}")
    row("ParaF1", "paraf1", lambda c: c["paraf1"], lambda v: f"{v:.3f}")
    row("Time (s)", "seconds", lambda c: c["seconds_single"], lambda v: f"{v:.3g}")
    lines.append("| selected k | " + " | ".join(str(columns[n]["k"]) if columns[n]["k"] is not None else "—"
                                             for n in names) + " |")
    return "\n".join(lines) + "\n"
