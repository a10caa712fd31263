"""STk as a layer: the token-routing and gradient-sparsification tables and their plots, from
``results/routing/`` (language-modelling runs), ``results/sparsification/`` (fmnistlt runs) and the
side-by-side benchmarks ``results/bench/{routing,sparsification}_<device>.json``.

Each table's header names the commands, the commits and dirty flags of the runs, and the rows still
missing (from ``configs/experiment/<group>/``) until none are. Where a row has several seeds, its
test score is shown as mean ± sample sd (ddof 1) with n and every seed's value.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from topklab.report.schema import code_versions

ROUTED_ROWS = [
    f"{router}_{c}" for router in ("top_k", "threshold_p", "stk_threshold") for c in ("c0125", "c025", "c05")
]
# what a sampled-threshold row runs, by its selector's adaptation (configs/gradient_exchange/sampled_threshold.yaml)
SAMPLED_RULES = {
    "bracketed": "sampled threshold, bracketed to k (exact top-k in effect)",
    "dgc": "sampled threshold, DGC's ×1.3 / ×0.8 rule",
}
# a selector's name as the benchmark stored it before it was named for its rule (results/bench/sparsification_cpu.json)
BENCH_SELECTORS = {"sampled threshold (DGC's rule)": "sampled threshold, bracketed to k"}
CAPACITY_BAND = (0.8, 1.2)  # a routed layer holds capacity c when its test share lies in [0.8c, 1.2c]


def _expected_rows(group: str, configs: Path | None) -> list[str]:
    folder = (configs or Path()) / "experiment" / group
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.name.startswith("_")) if configs else []


def _header(title: str, command: str, results: list[dict], expected: list[str], group: str) -> list[str]:
    have = {r["result"]["row"] for r in results}
    missing = [row for row in expected if row not in have]
    lines = [f"# {title}", "", f"Runs: `{command}`; commits {code_versions(results, width=7)}."]
    if expected:
        lines.append(
            f"Missing rows: {', '.join(f'`{group}/{m}`' for m in missing)}." if missing else "All rows present."
        )
    return lines + [""]


def _by_row(results: list[dict]) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for result in results:
        rows.setdefault(result["result"]["row"], []).append(result)
    return rows


def _spread(values: list[float]) -> str:
    """``mean ± sample sd (n = …): v1, v2, …`` for several seeds, the value for one."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return (
        f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} (n = {len(values)}: "
        f"{', '.join(f'{v:.2f}' for v in values)})"
    )


def _fmt(value, digits: int = 2, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}"


def _causal(result: dict) -> bool:
    """Whether the row's test perplexity is causal: every router but a top-k without its predictor."""
    router = (result["config"].get("model") or {}).get("router") or {}
    return not (router.get("_target_", "").endswith("TopKRouter") and router.get("inference", "top_k") == "top_k")


def _per_layer(summaries: list[dict], split: str) -> str:
    """Routed shares per routed layer, means over seeds ("—" dense, "not logged" before they were logged)."""
    if split == "test":
        layers = [s["metrics"]["test"].get("routed_fraction_per_layer") for s in summaries]
    else:
        layers = [
            [v for k, v in sorted((s["history"] or [{}])[-1].items()) if k.startswith("train_routed_fraction_layer")]
            for s in summaries
        ]
    if any(not v for v in layers):
        return "—" if all(s["metrics"]["test"].get("routed_fraction") is None for s in summaries) else "not logged"
    return " / ".join(f"{statistics.mean(column):.3f}" for column in zip(*layers))


def _capacity(result: dict) -> float | None:
    """The share c of tokens a row's router targets: its ``capacity``, or 1 − p for threshold-p (None: dense)."""
    router = (result["config"].get("model") or {}).get("router") or {}
    if "capacity" in router:
        return router["capacity"]
    return 1 - router["probability"] if "probability" in router else None


def _test_shares(result: dict) -> list[tuple[int, int, float]]:
    """``(seed, layer, share)`` for each routed layer's test share of one run (layers by their index in
    the model: ``model.routed_layers``, by default every other one from the second)."""
    shares = result["result"]["summary"]["metrics"]["test"].get("routed_fraction_per_layer") or []
    model = result["config"].get("model") or {}
    layers = model.get("routed_layers") or list(range(1, model.get("layers", 0), 2))
    if len(layers) != len(shares):
        layers = list(range(1, len(shares) + 1))
    return [(result["config"].get("seed", 0), layer, share) for layer, share in zip(layers, shares)]


def capacity_check(runs: list[dict]) -> tuple[tuple[int, int, float] | None, list[tuple[int, int, float]], int]:
    """For one row's runs: the per-seed, per-layer test share farthest from c (relative to c), those
    outside ``CAPACITY_BAND`` · c, and how many there are in all; ``(None, [], n)`` for a row without c.

    Examples
    --------
    >>> run = {"config": {"seed": 1, "model": {"layers": 4, "router": {"capacity": 0.25}}},
    ...        "result": {"summary": {"metrics": {"test": {"routed_fraction_per_layer": [0.19, 0.26]}}}}}
    >>> capacity_check([run])
    ((1, 1, 0.19), [(1, 1, 0.19)], 2)
    """
    shares = [share for run in runs for share in _test_shares(run)]
    c = _capacity(runs[0])
    if c is None or not shares:
        return None, [], len(shares)
    low, high = (factor * c for factor in CAPACITY_BAND)
    worst = max(shares, key=lambda s: abs(s[2] / c - 1))
    return worst, [s for s in shares if not low <= s[2] <= high], len(shares)


def _capacity_footnote(flagged: dict[str, tuple[list[tuple[int, int, float]], int]]) -> list[str]:
    """The ‡ footnote: per flagged row, which seed's layer routed a test share outside [0.8c, 1.2c]."""
    if not flagged:
        return []
    named = []
    for label, (outside, total) in flagged.items():
        values = [share for _, _, share in outside]
        named.append(
            f"{label}: all {total} ({min(values):.3f}–{max(values):.3f})"
            if len(outside) == total
            else f"{label}: {', '.join(f'seed {seed} layer {layer} {share:.3f}' for seed, layer, share in outside)}"
        )
    low, high = CAPACITY_BAND
    return [
        "",
        f"‡ Capacity not held: these seeds' routed layers processed a share of the test tokens outside "
        f"[{low}c, {high}c]: {'; '.join(named)}.",
    ]


def render_routing(results: list[dict], bench: dict | None, configs: Path | None = None) -> str:
    """Markdown of ``results/tables/routing.md``.

    Examples
    --------
    >>> render_routing([], None).splitlines()[0]
    '# Token routing on Multi30k (English LM): exact top-k, threshold-p and a learned STk threshold'
    """
    lines = _header(
        "Token routing on Multi30k (English LM): exact top-k, threshold-p and a learned STk threshold",
        "make reproduce-routing",
        results,
        _expected_rows("routing", configs),
        "routing",
    )
    lines += [
        "Layers 1 and 3 of a 4-layer LM route; *routed* is the fraction of test tokens those layers processed",
        "(mean of the two). Perplexity is per token on test2016, at the epoch with the best validation",
        "perplexity. *Causal*: the routing of a token depends only on earlier tokens, so token-by-token",
        "decoding gives the same numbers; top-k's test perplexity sees each whole sentence when it routes",
        "(as in training) and cannot be reproduced by decoding. *Step (run)*: median training step of the",
        "run itself (two runs shared the 2 cores, so compare within the table only); *step vs dense*: the",
        "side-by-side benchmark below.",
        "",
        "*Routed per layer*: the share of real tokens layers 1 / 3 processed in training (the last epoch, in",
        "training mode) and on test, means over seeds; the target is c (threshold-p: 1 − p). *Worst seed*: the",
        "one seed's one layer whose test share is farthest from c; ‡: some seed's layer outside [0.8c, 1.2c].",
        "",
        "| row | causal | routed (test) | routed per layer, train | routed per layer, test | worst seed, test "
        "| val ppl | test ppl (mean ± sample sd, n seeds) | Δ test ppl vs dense | step (run), s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_row = _by_row(results)
    mean = statistics.mean

    def test_ppl(row: str) -> list[float]:
        return [r["result"]["summary"]["metrics"]["test"]["perplexity"] for r in by_row[row]]

    dense_ppl = mean(test_ppl("dense")) if "dense" in by_row else None
    order = ["dense", *ROUTED_ROWS]
    flagged = {}
    for row in [r for r in order if r in by_row] + sorted(set(by_row) - set(order)):
        summaries = [r["result"]["summary"] for r in by_row[row]]
        routed = [s["metrics"]["test"].get("routed_fraction") for s in summaries]
        routed_cell = "1 (dense)" if None in routed else f"{mean(routed):.3f}"
        delta = "—" if row == "dense" or dense_ppl is None else f"{mean(test_ppl(row)) - dense_ppl:.2f}"
        label = by_row[row][0]["result"]["label"]
        worst, outside, total = capacity_check(by_row[row])
        if outside:
            flagged[label] = (outside, total)
        lines.append(
            f"| {label}{' ‡' if outside else ''} | {'yes' if _causal(by_row[row][0]) else 'no'} | {routed_cell} "
            f"| {_per_layer(summaries, 'train')} | {_per_layer(summaries, 'test')} "
            f"| {'—' if worst is None else f'{worst[2]:.3f} (seed {worst[0]}, layer {worst[1]})'} "
            f"| {mean(s['metrics']['val']['perplexity'] for s in summaries):.2f} | {_spread(test_ppl(row))} "
            f"| {delta} | {mean(s['cost']['step_time_s'] for s in summaries):.3f} |"
        )
    lines += _capacity_footnote(flagged)
    if bench is not None:
        lines += [
            "",
            f"## Step time against dense, side by side (`{bench['command']}`, {bench['result']['device']}, "
            f"{bench['result']['threads']} thread(s))",
            "",
            "| batch shape | variant | routed | step, ms | vs dense |",
            "|---|---|---|---|---|",
        ]
        for row in bench["result"]["rows"]:
            lines.append(
                f"| {row['shape']} | {row['variant']} | {row['routed_fraction']:.3f} | {row['step_seconds'] * 1e3:.1f} "
                f"| {row['vs_dense']:.2f} |"
            )
    else:
        lines += ["", "Step-time benchmark missing: run `python -m benchmarks routing`."]
    return "\n".join(lines) + "\n"


def _sparsification_label(result: dict) -> str:
    """A row's label, a sampled-threshold row's named for the rule its selector ran (:data:`SAMPLED_RULES`).

    Examples
    --------
    >>> selector = {"engine": {"gradient_exchange": {"selector": {"adaptation": "bracketed"}}}}
    >>> _sparsification_label({"config": selector, "result": {"label": "sampled threshold (DGC's rule), 1 %"}})
    'sampled threshold, bracketed to k (exact top-k in effect), 1 %'
    """
    exchange = (result["config"].get("engine") or {}).get("gradient_exchange") or {}
    rule = SAMPLED_RULES.get((exchange.get("selector") or {}).get("adaptation"))
    label = result["result"]["label"]
    return f"{rule}, {label.rsplit(', ', 1)[-1]}" if rule else label


def render_sparsification(results: list[dict], bench: dict | None, configs: Path | None = None) -> str:
    """Markdown of ``results/tables/gradient_sparsification.md``.

    Examples
    --------
    >>> render_sparsification([], None).splitlines()[0][:75]
    '# Top-k gradient sparsification with error feedback: exact top-k, sampled t'
    """
    lines = _header(
        "Top-k gradient sparsification with error feedback: exact top-k, sampled threshold (bracketed to k; DGC's "
        "×1.3 / ×0.8 rule), STk threshold",
        "make reproduce-sparsification",
        results,
        _expected_rows("sparsification", configs),
        "sparsification",
    )
    lines += [
        "ResNet-32 on fmnistlt (the fmnistlt recipe: 20 epochs, SGD with momentum, batch 128) on 4 simulated",
        "workers of 32 images; each worker sends the given share of its residual per step, error feedback keeps",
        "the rest. *Sent*: the mean share a worker actually sent; *selection*: mean time per worker message",
        "inside the run. Test top-1 / top-5 (%) at the epoch with the best balanced-validation top-1. Of DGC only",
        "the sampled threshold is used: no momentum correction, factor masking, local clipping or warm-up, and one",
        "selection over all parameters (not per tensor). *Bracketed to k*: the threshold bisected until at least",
        "k entries pass, trimmed to k, so it sends exactly k and trains as exact top-k; *DGC's ×1.3 / ×0.8 rule*:",
        "the reference's adaptation, which can stop below k and then sends fewer.",
        "",
        "| row | sent (%) | selection, ms | val top-1 | test top-1 (mean ± sample sd, n seeds) | test top-5 | train time, s |",
        "|---|---|---|---|---|---|---|",
    ]
    order = ["dense_1worker", "dense"] + [
        f"{s}_{p}"
        for p in ("1pct", "01pct")
        for s in ("exact_topk", "sampled_threshold", "sampled_threshold_dgc", "stk_threshold")
    ]
    by_row = _by_row(results)
    for row in [r for r in order if r in by_row] + sorted(set(by_row) - set(order)):
        summaries = [r["result"]["summary"] for r in by_row[row]]
        history = [h for summary in summaries for h in summary["history"]]
        sent = [h["sent_fraction"] for h in history if h.get("sent_fraction") is not None]
        selection = [h["selection_s"] for h in history if h.get("selection_s") is not None]
        mean = statistics.mean
        lines.append(
            f"| {_sparsification_label(by_row[row][0])} | {_fmt(mean(sent) if sent else None, 3, 100)} "
            f"| {_fmt(mean(selection) if selection else None, 2, 1e3)} "
            f"| {mean(s['metrics']['val']['top1'] for s in summaries):.2f} "
            f"| {_spread([s['metrics']['test']['top1'] for s in summaries])} "
            f"| {mean(s['metrics']['test']['top5'] for s in summaries):.2f} "
            f"| {mean(s['train_seconds'] for s in summaries):.0f} |"
        )
    if bench is not None:
        lines += [
            "",
            f"## Selection time against the parameter count, side by side (`{bench['command']}`, "
            f"{bench['result']['device']}, {bench['result']['threads']} thread(s))",
            "",
            "Gradient-like magnitudes |N(0,1)|·exp(N(0,1)); median of the repeats; *vs top-k* is measured in the",
            "same run; *sent / k* and *recall* (the share of the true top-k sent) check what each rule selects.",
            "",
            "*vs floor*: against one read of the vector (`x.abs().sum()`, same run); *passes*: reads of the vector",
            "(STk: 6 per Newton step + 2); *sent / k (p5–p95)*: over 20 messages of the sampled threshold.",
            "",
            "| parameters | keep | selector | time, ms | vs top-k | vs floor | ns / element | passes | sent / k "
            "| sent / k (p5–p95) | recall |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in bench["result"]["rows"]:
            spread = row.get("sent_over_k_p5_p95")
            lines.append(
                f"| {row['n']:,} | {row['ratio']:.1%} | {BENCH_SELECTORS.get(row['selector'], row['selector'])} "
                f"| {row['seconds'] * 1e3:.2f} "
                f"| {row['vs_topk']:.2f} | {_fmt(row.get('vs_floor'), 1)} | {_fmt(row.get('ns_per_element'), 2)} "
                f"| {row.get('passes', '—')} | {_fmt(row['count_over_k'], 3)} "
                f"| {'—' if spread is None else f'{spread[0]:.3f}–{spread[1]:.3f}'} | {_fmt(row['recall'], 3)} |"
            )
    else:
        lines += ["", "Selection benchmark missing: run `python -m benchmarks sparsification`."]
    return "\n".join(lines) + "\n"


def plot_routing(results: list[dict], path: Path) -> None:
    """Test perplexity against the routed fraction (means over seeds), one line per router over c; dense as a
    line; titled with the data set and the device the runs ran on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def row_means(rows: list[dict]) -> tuple[float, float]:
        metrics = [r["result"]["summary"]["metrics"]["test"] for r in rows]
        routed = [m.get("routed_fraction") for m in metrics]
        return (1.0 if None in routed else statistics.mean(routed), statistics.mean(m["perplexity"] for m in metrics))

    by_row = _by_row(results)
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    for prefix, label, marker in (
        ("top_k", "top-k (MoD; not causal)", "o"),
        ("threshold_p", "threshold-p = 1 − c", "s"),
        ("stk_threshold", "learned STk threshold", "^"),
    ):
        points = sorted(
            row_means(by_row[row]) for row in (f"{prefix}_{c}" for c in ("c0125", "c025", "c05")) if row in by_row
        )
        if points:
            axis.plot(*zip(*points), marker=marker, label=label)
    for row in sorted(set(by_row) - {"dense", *ROUTED_ROWS}):
        axis.plot(
            *row_means(by_row[row]), marker="x", ls="none", color="black", label=by_row[row][0]["result"]["label"]
        )
    if "dense" in by_row:
        axis.axhline(row_means(by_row["dense"])[1], color="gray", ls="--", label="dense")
    from topklab.report.charts import device_of

    data = sorted({((r.get("config") or {}).get("dataset") or {}).get("name", "data not recorded") for r in results})
    axis.set_xlabel("fraction of tokens the routed layers processed (test; capacity c = k/n)")
    axis.set_ylabel("test perplexity")
    axis.set_title(f"token routing, {', '.join(data)} ({device_of(results)}), means over seeds", fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_sparsification(bench: dict, path: Path) -> None:
    """Selection time against the parameter count, one panel per keep ratio k/n, titled with the
    benchmark's data and the device it ran on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bench["result"]["rows"]
    ratios = sorted({r["ratio"] for r in rows}, reverse=True)
    figure, axes = plt.subplots(1, len(ratios), figsize=(5 * len(ratios), 3.8), sharey=True, squeeze=False)
    for axis, ratio in zip(axes[0], ratios):
        for selector in dict.fromkeys(r["selector"] for r in rows):
            points = sorted(
                (r["n"], r["seconds"] * 1e3) for r in rows if r["ratio"] == ratio and r["selector"] == selector
            )
            axis.plot(*zip(*points), marker="o", label=BENCH_SELECTORS.get(selector, selector))
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(f"keep k/n = {ratio:.1%}", fontsize=10)
        axis.set_xlabel("parameters n")
    axes[0][0].set_ylabel("selection time per worker, ms")
    axes[0][0].legend(fontsize=8)
    from topklab.report.charts import device_of

    figure.suptitle(
        f"selecting k of n gradient-like magnitudes (|N(0, 1)|·exp(N(0, 1))), {device_of([bench])}", fontsize=11
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
