"""Markdown tables of the translation experiments from their results (``results/translation/``,
one file per run with payload ``{table, row, label, summary}``): test sacreBLEU (mean ± std and
every seed), tokenised BLEU, chrF, the averaged-checkpoint BLEU, cost, and the paper's BLEU beside
ours; then the validation curve and λ's trajectory per epoch. A paper entry is matched to a
translation table by its ``translation_table`` field in ``results/paper/*.yaml``."""

from __future__ import annotations

from pathlib import Path

from topklab.losses.aggregate.lambda_monitor import ALL_STEPS
from topklab.report.paired import paired_lines, render_sweep_table, sweep_points, table_groups, with_gpu_table
from topklab.report.resumed import resumed, resumed_footnote
from topklab.report.schema import code_versions
from topklab.report.stats import mean_std
from topklab.report.tracking import band_cell, flag_lines
from topklab.report.vision import by_table
from topklab.utils.errors import TopklabError

TABLE5_ROWS = ("average", "atk", "stk")  # every translation table compares these (STk paper Table 5)
BASELINE = "average"  # the row every other is paired with, seed by seed
DIAGNOSTICS = (
    ("in_band", "λ in band"),
    ("in_band_all", "in band (all steps)"),
    ("smoothed_share", "smoothed share > λ"),
    ("hard_share", "hard share > λ"),
    ("lam_minus_kth", "λ − ℓ_[k]"),
)  # summary["lambda_tracking"], last epoch


def _cell(values, digits: int = 2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _seeds(results: list[dict]) -> str:
    """Each seed's test sacreBLEU, § after a resumed run's."""
    return ", ".join(
        f"{r['result']['summary']['metrics']['test']['bleu']:.2f}" + (" §" if resumed(r) else "") for r in results
    )


def _per_epoch(summaries: list[dict], key: str) -> list[float | None]:
    """The mean over seeds of ``history[epoch][key]``, for the epochs every seed reached."""
    length = min(len(s["history"]) for s in summaries)
    columns = [[s["history"][e][key] for s in summaries] for e in range(length)]
    return [None if any(v is None for v in column) else sum(column) / len(column) for column in columns]


def render_translation_table(
    name: str, rows: dict[str, list[dict]], paper: dict | None = None, configured: list[str] = ()
) -> str:
    """Markdown for one translation table.

    Parameters
    ----------
    name : the table id (payload ``table``: multi30k, iwslt14, wmt17)
    rows : ``{row: [result, ...]}`` of that table
    paper : ``{"caption", "note", "rows": {row: {"bleu": value}}}`` from results/paper, or None
    configured : the rows of the table's experiment group (:func:`~topklab.report.paired.table_groups`):
        those without a result are listed as missing after the paper's and Table 5's

    Examples
    --------
    >>> from topklab.report.schema import read_results
    >>> text = render_translation_table("multi30k", by_table(read_results("results/translation"))["multi30k"])  # doctest: +SKIP
    """
    published = (paper or {}).get("rows", {})
    order = list(dict.fromkeys([*published, *TABLE5_ROWS, *configured]))
    present = [r for r in order if r in rows] + sorted(set(rows) - set(order))
    if not present:
        raise TopklabError(f"no results for the {name} table; run its rows first (docs/translation.md)")
    runs = [r for row in present for r in rows[row]]
    first = runs[0]
    engine, task = first["config"]["engine"], first["config"]["task"]
    labels = {row: rows[row][0]["result"]["label"] for row in present}
    commands = sorted({r["command"] for r in runs})
    missing = [r for r in order if r not in rows]
    test = first["result"]["summary"]["metrics"]["test"]
    device = first["result"]["summary"].get("device", "cpu").partition(":")[0]
    rows_of = f"stk/{name.removesuffix(f'_{device}')}"  # a table of runs on another device: <table>_<device>
    shared = (
        "the CPU with other jobs (two one-thread runs at a time)"
        if device == "cpu"
        else f"one {', '.join(first['provenance']['hardware'].get('gpus') or [device])} with the table's other runs"
    )
    lines = [
        f"# {name}: test BLEU, mean ± std over seeds (population std; the sample std is √(n/(n − 1)) times it)",
        "",
    ]
    if missing:
        lines += [
            f"**Still missing:** {', '.join(missing)} (run `python train.py experiment={rows_of}/<row> seed=<k>`, "
            f"then `make tables`).",
            "",
        ]
    if paper:
        lines += [f"Paper: {paper['caption']}." + (f" {paper['note']}" if paper.get("note") else ""), ""]
    search = task["search"]
    lines += [
        f"Each row: `python train.py experiment={rows_of}/<row> seed=<k>`; {engine['epochs']} epochs of "
        f"{engine['batch_size']}-token batches, the state with the best validation {', '.join(engine['select_metrics'])} "
        f"(greedy decoding) is tested with beam {search['beam']} (length penalty {search['length_penalty']}); "
        f"code {code_versions(runs)}.  ",
        f"Commands: {'; '.join(f'`{c}`' for c in commands[:3])}{' …' if len(commands) > 3 else ''}.  ",
        f"sacreBLEU signature: `{test['bleu_signature']}`; BLEU (tok) is BLEU on the corpus's own whitespace tokens "
        f"(tokenize=none: fairseq-style tokenised BLEU for pre-tokenised corpora). avg-last is the test sacreBLEU of "
        f"the mean of the last {engine.get('average_last') or 0} epoch weights. *s / epoch* and *target tokens / s* are "
        f"each run's own wall time while it shared {shared}: not a "
        f"benchmark; `python -m benchmarks step_share` compares the aggregates' cost side by side.",
        "",
    ]
    has_paper = any(published.get(r) for r in present)
    head = [
        "row",
        "seeds",
        "sacreBLEU",
        "per seed",
        "BLEU (tok)",
        "chrF",
        "avg-last",
        "val BLEU",
        "best epoch",
        "final λ",
        "λ in band",
        "s / epoch",
        "target tokens / s",
    ] + (["paper BLEU"] if has_paper else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in present:
        summaries = [r["result"]["summary"] for r in rows[row]]
        bleu = [s["metrics"]["test"]["bleu"] for s in summaries]
        averaged = [s["averaged"]["test"]["bleu"] for s in summaries if s.get("averaged")]
        cells = [
            labels[row],
            str(len(summaries)),
            _cell(bleu),
            _seeds(rows[row]),
            _cell(s["metrics"]["test"]["bleu_tok"] for s in summaries),
            _cell(s["metrics"]["test"]["chrf"] for s in summaries),
            _cell(averaged),
            _cell(s["metrics"]["val"]["bleu"] for s in summaries),
            _cell((s["best_epoch"] for s in summaries), 0),
            _cell((s["lambda"] for s in summaries), 3),
            band_cell(summaries),
            _cell((s["train_seconds"] / s["epochs"] for s in summaries), 0),
            _cell((sum(h["losses_per_s"] for h in s["history"]) / len(s["history"]) for s in summaries), 0),
        ]
        if has_paper:
            cells.append(f"{published[row]['bleu']:.2f}" if row in published else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += resumed_footnote(present, rows, labels)
    lines += flag_lines({row: rows[row] for row in present}, labels)
    lines += _tracking_section(present, rows, labels)
    lines += paired_lines(present, rows, labels, BASELINE, test_bleu, "test sacreBLEU")
    curves = {row: [r["result"]["summary"] for r in rows[row]] for row in present}
    epochs = max(len(_per_epoch(s, "val_bleu")) for s in curves.values())
    thresholded = [row for row in present if any(v is not None for v in _per_epoch(curves[row], "lambda"))]
    lines += [
        "",
        "Validation sacreBLEU (greedy) and λ per epoch, mean over seeds.",
        "",
        "| epoch | "
        + " | ".join(f"{labels[r]} val BLEU" for r in present)
        + "".join(f" | {labels[r]} λ" for r in thresholded)
        + " |",
        "|---|" + "---|" * (len(present) + len(thresholded)),
    ]
    for e in range(epochs):
        values = []
        for row in present:
            curve = _per_epoch(curves[row], "val_bleu")
            values.append(f"{curve[e]:.2f}" if e < len(curve) else "—")
        for row in thresholded:
            curve = _per_epoch(curves[row], "lambda")
            values.append(f"{curve[e]:.4f}" if e < len(curve) and curve[e] is not None else "—")
        lines.append(f"| {e + 1} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def _tracking_section(present, rows, labels) -> list[str]:
    """λ's diagnostics per seed for the rows with a threshold, and each seed's flag (λ did not track or
    partly tracked); λ in band is marked "(all steps)" for a seed judged on all its steps."""
    tracked = [row for row in present if any(r["result"]["summary"].get("lambda") is not None for r in rows[row])]
    if not tracked:
        return []
    lines = [
        "",
        "λ diagnostics per seed (λ in band: the share of training steps after the first 10 % whose smoothed share "
        "above λ is within a factor 2 of k/n and its complement within a factor 2 of 1 − k/n; shares and λ − ℓ_[k] "
        "are the last epoch's means, ℓ_[k] the batch's k-th largest token loss, sampled every 50 steps).",
        "",
        "| row | seed | " + " | ".join(title for _, title in DIAGNOSTICS) + " | flag |",
        "|" + "---|" * (len(DIAGNOSTICS) + 3),
    ]
    for row in tracked:
        for result in sorted(rows[row], key=lambda r: r["config"]["seed"]):
            tracking = result["result"]["summary"].get("lambda_tracking") or {}
            values = ["not logged" if tracking.get(key) is None else f"{tracking[key]:.3f}" for key, _ in DIAGNOSTICS]
            if tracking.get("judged_on") == ALL_STEPS:  # stopped within its burn-in: λ in band is over all steps
                values[0] += f" ({ALL_STEPS})"  # DIAGNOSTICS[0] is in_band
            lines.append(
                f"| {labels[row]} | {result['config']['seed']} | "
                + " | ".join(values)
                + f" | {tracking.get('flag') or ''} |"
            )
    return lines


def test_bleu(result: dict) -> float:
    """A translation result's test sacreBLEU (of the selected state)."""
    return result["result"]["summary"]["metrics"]["test"]["bleu"]


def render_translation(results: list[dict], papers: list[dict], configs: Path | None = None) -> dict[str, str]:
    """``{"<table>.md": text}`` for every translation table with results (``results/translation``);
    ``configs`` names the rows each table's experiment group configures, so that those not run yet are
    listed as missing, and a group with a baseline and rows at several k gets ``<table>_k.md``, the k
    sweep (and ``<table>_cuda_k.md`` for its runs on a GPU, filed in ``<table>_cuda``).

    Examples
    --------
    >>> render_translation([], [])
    {}
    """
    specs = {
        spec["translation_table"]: spec
        for paper in papers
        for spec in paper.values()
        if isinstance(spec, dict) and "translation_table" in spec
    }
    groups = table_groups(configs, "translation")
    tables = by_table(results)
    rendered = {
        f"{name}.md": render_translation_table(name, rows, specs.get(name), list(groups.get(name, {}).get("rows", {})))
        for name, rows in sorted(tables.items())
    }
    for name, settings in sorted(groups.items()):
        if settings.get("baseline") and sweep_points(settings, {}, test_bleu):
            for table in with_gpu_table(name, tables):
                rendered[f"{table}_k.md"] = render_sweep_table(
                    table, tables.get(table, {}), settings, test_bleu, "test sacreBLEU"
                )
    return dict(sorted(rendered.items()))
