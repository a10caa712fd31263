"""The pictures beside the result tables, each drawn from committed results only.

- :func:`lambda_against_kth`: λ and the batch's k-th loss per epoch for every row of a table that
  logs λ (a tracked row beside one whose λ did not track).
- :func:`seed_strips`: each seed's test value per row, the mean marked, beside a table of means.
- :func:`cost_against_n`: forward + backward time against n, one panel per benchmark file.
- :func:`operator_times`: the soft top-k operators' time against n.
- :func:`routed_share_per_layer`: the share of tokens each routed layer processed, per row.
- :func:`difference_against_k`: a k sweep's paired difference from its baseline against k/n.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from topklab.report.tracking import not_stk  # noqa: E402

MARKERS = "os^vDP*Xh<>p"
LAMBDA_KEYS = ("lambda", "lam_minus_kth")


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _label(runs: list[dict]) -> str:
    return runs[0]["result"]["label"]


def lambda_rows(rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The rows whose runs log λ and λ − ℓ_[k] in every epoch of their history.

    Examples
    --------
    >>> run = lambda lam, gap: {"result": {"summary": {"history": [{"lambda": lam, "lam_minus_kth": gap}]}}}
    >>> list(lambda_rows({"stk": [run(1.0, 0.0)], "sampled": [run(1.0, None)], "average": [run(None, None)]}))
    ['stk']
    """
    return {
        row: runs
        for row, runs in rows.items()
        if all(h.get(key) is not None for r in runs for h in r["result"]["summary"]["history"] for key in LAMBDA_KEYS)
    }


def lambda_against_kth(rows: dict[str, list[dict]], title: str, path: Path) -> None:
    """Per epoch and seed: λ (solid) and the batch's k-th loss ℓ_[k] (dashed, λ minus the epoch's mean
    sampled λ − ℓ_[k]) on the left, λ − ℓ_[k] on the right; one colour per row."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for index, runs in enumerate(lambda_rows(rows).values()):
        color = f"C{index}"
        flagged = any(not_stk(r["result"]["summary"].get("lambda_tracking") or {}) for r in runs)
        name = _label(runs) + (" (flagged: λ did not track)" if flagged else "")
        for seed, run in enumerate(runs):
            history = run["result"]["summary"]["history"]
            epochs = [h["epoch"] for h in history]
            lam = [h["lambda"] for h in history]
            gap = [h["lam_minus_kth"] for h in history]
            first = seed == 0
            left.plot(epochs, lam, color=color, lw=1, label=f"{name}: λ" if first else None)
            left.plot(
                epochs,
                [v - g for v, g in zip(lam, gap)],
                color=color,
                lw=1,
                ls="--",
                label=f"{name}: ℓ_[k]" if first else None,
            )
            right.plot(epochs, gap, color=color, lw=1, marker=".", label=name if first else None)
    right.axhline(0.0, color="gray", lw=0.8)
    left.set(xlabel="epoch", ylabel="value", title="λ and the batch's k-th loss ℓ_[k]")
    right.set(xlabel="epoch", ylabel="λ − ℓ_[k] (mean over the epoch)", title="the gap (0: λ tracks)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.suptitle(f"{title}: one line per seed")
    _save(figure, path)


def strip_values(runs: list[dict], value) -> tuple[list[float], list[float]]:
    """A row's values as its strip draws them: (the runs the mean counts, the diverged runs), each
    without the runs whose ``value`` is None."""
    from topklab.report.divergence import diverged

    kept = [v for v in (value(r) for r in runs if not diverged(r)) if v is not None]
    dropped = [v for v in (value(r) for r in runs if diverged(r)) if v is not None]
    return kept, dropped


def seed_strips(rows: dict[str, list[dict]], value, unit: str, title: str, path: Path) -> None:
    """One strip per row: each seed's ``value(result)`` as a dot, the mean as a bar; a diverged run
    (:func:`topklab.report.divergence.diverged`) is a red cross, left out of the mean as the tables
    leave it out.

    Parameters
    ----------
    rows : ``{row: [result, ...]}`` in the table's order
    value : a result's test value (None: left out)
    unit : the axis label
    """
    figure, axis = plt.subplots(figsize=(6.5, 0.5 * len(rows) + 1.2))
    names = []
    any_diverged = False
    for position, runs in enumerate(reversed(list(rows.values()))):
        kept, dropped = strip_values(runs, value)
        names.append(_label(runs))
        axis.scatter(kept, [position] * len(kept), color="C0", alpha=0.7, zorder=3)
        if dropped:
            any_diverged = True
            axis.scatter(dropped, [position] * len(dropped), color="C3", marker="x", zorder=3)
        if kept:
            axis.plot([sum(kept) / len(kept)] * 2, [position - 0.3, position + 0.3], color="k", lw=2)
    axis.set_yticks(range(len(names)), names, fontsize=8)
    axis.set_ylim(-0.6, len(names) - 0.4)
    axis.grid(True, axis="x", alpha=0.3)
    crosses = "\n(a cross: a diverged run, left out of the mean)" if any_diverged else ""
    axis.set(xlabel=unit, title=f"{title}: each seed (dots) and the mean (bar){crosses}")
    _save(figure, path)


def _bench_lines(axis, rows: list[dict], series, x, y) -> None:
    for index, name in enumerate(dict.fromkeys(map(series, rows))):
        points = sorted((x(r), y(r)) for r in rows if series(r) == name and y(r) is not None)
        style = {"marker": MARKERS[index % len(MARKERS)], "ls": ("-", "--")[index // 10 % 2]}  # 10 colours
        axis.plot(*zip(*points), ms=4, label=name, **style)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)


def cost_against_n(topk: dict[str, dict], tracked: dict | None, path: Path) -> None:
    """Time per forward + backward against n at k = 0.1n: a panel per ``topk`` benchmark
    (``{title: result of bench_topk}``), and one for the tracked-λ kernels on a GPU (float32)."""
    panels = len(topk) + (tracked is not None)
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    for axis, (title, result) in zip(axes[0], topk.items()):
        rows = [r for r in result["result"]["results"] if r["k_label"] in ("0.1n", "-")]
        _bench_lines(axis, rows, lambda r: r["loss"], lambda r: r["n"], lambda r: r["seconds"] * 1e3)
        axis.set(xlabel="n (k = 0.1n)", ylabel="forward + backward (ms)", title=title)
    if tracked is not None:
        axis = axes[0][-1]
        rows = [
            {"n": r["n"], "name": name, "ms": us / 1e3}
            for r in tracked["result"]["rows"]
            if r["dtype"] == "float32" and r["k"] == "0.1"
            for name, us in r["us"].items()
        ]
        _bench_lines(axis, rows, lambda r: r["name"], lambda r: r["n"], lambda r: r["ms"])
        axis.set(
            xlabel="n (k = 0.1n, float32)",
            ylabel="forward + backward (ms)",
            title=f"tracked λ, {tracked['result']['meta']['device']}",
        )
    figure.suptitle("cost against n: the aggregates' forward + backward on one vector of n losses")
    _save(figure, path)


def operator_times(bench: dict, path: Path) -> None:
    """Forward + backward time of each soft top-k operator against n (k = n/2, batch 1)."""
    rows = [
        {"operator": r["operator"], "n": s["n"], "ms": s["ms"]}
        for r in bench["result"]["rows"]
        for s in r["speed"]
        if s.get("ms") is not None and not s.get("stopped")
    ]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    _bench_lines(axis, rows, lambda r: r["operator"], lambda r: r["n"], lambda r: r["ms"])
    axis.legend(fontsize=7, ncol=2)
    axis.set(
        xlabel="n (k = n/2, batch 1)",
        ylabel="forward + backward (ms)",
        title=f"soft top-k operators, {bench['result']['device']}",
    )
    _save(figure, path)


def routed_shares(rows: dict[str, list[dict]]) -> dict[str, list[list[float]]]:
    """``{row: [each seed's test share per routed layer]}`` for the rows that route.

    Examples
    --------
    >>> run = lambda shares: {"result": {"summary": {"metrics": {"test": {"routed_fraction_per_layer": shares}}}}}
    >>> routed_shares({"dense": [run([])], "top_k": [run([0.5, 0.4])]})
    {'top_k': [[0.5, 0.4]]}
    """
    shares = {
        row: [r["result"]["summary"]["metrics"]["test"].get("routed_fraction_per_layer") for r in runs]
        for row, runs in rows.items()
    }
    return {row: seeds for row, seeds in shares.items() if all(seeds)}


def routed_share_per_layer(rows: dict[str, list[dict]], path: Path) -> None:
    """The test share of tokens each routed layer processed (mean over seeds): a bar per layer, a
    group per routed row (:func:`routed_shares`)."""
    routed = routed_shares(rows)
    figure, axis = plt.subplots(figsize=(7, 0.45 * len(routed) + 1.5))
    layers = max(len(shares[0]) for shares in routed.values())
    height = 0.8 / layers
    for position, shares in enumerate(reversed(list(routed.values()))):
        means = [sum(layer) / len(layer) for layer in zip(*shares)]
        for layer, mean in enumerate(means):
            offset = position + (layers - 1 - 2 * layer) * height / 2
            axis.barh(offset, mean, height, color=f"C{layer}", label=f"layer {layer}" if position == 0 else None)
    axis.set_yticks(range(len(routed)), [_label(rows[row]) for row in reversed(list(routed))], fontsize=7)
    axis.set_xlabel("share of tokens the layer processed (test)")
    axis.set_title("routed share per layer, mean over seeds")
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(fontsize=7)
    _save(figure, path)


def difference_against_k(
    series: dict[str, list[dict]], baseline: str, title: str, what: str, unit: str, path: Path
) -> None:
    """The mean paired difference from ``baseline`` against k/n, one line per series, with its 95 %
    t-interval as an error bar (none for a single seed) and each point's number of seeds beside it.

    Parameters
    ----------
    series : ``{name: [{"k", "pairs": [(seed, difference), ...]}, ...]}``
        (:func:`topklab.report.paired.sweep_points`); points without pairs are left out, and a series
        without any, so that the series drawn keep their places and colours until its runs exist
    what, unit : the value differenced and its unit ("test top-1", "points")
    """
    from topklab.report.paired import t_interval

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    series = {name: points for name, points in series.items() if any(p["pairs"] for p in points)}
    for index, (name, points) in enumerate(series.items()):
        drawn = [(p["k"], *t_interval([d for _, d in p["pairs"]]), len(p["pairs"])) for p in points if p["pairs"]]
        offset = (index - (len(series) - 1) / 2) * 0.006  # side by side at a shared k
        ks = [k + offset for k, *_ in drawn]
        means = [mean for _, mean, _, _ in drawn]
        errors = [0.0 if half is None else half for _, _, half, _ in drawn]
        axis.errorbar(ks, means, yerr=errors, marker=MARKERS[index], capsize=4, color=f"C{index}", label=name)
        for k, mean, n in zip(ks, means, (n for *_, n in drawn)):
            axis.annotate(f"n = {n}", (k, mean), textcoords="offset points", xytext=(6, 4), fontsize=7)
    axis.axhline(0.0, color="gray", lw=0.8)
    axis.set_xlim(0.45, 1.0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    axis.set(
        xlabel="k/n (share of the batch's losses kept)",
        ylabel=f"{what} minus {baseline}'s ({unit})",
        title=f"{title}: difference from {baseline}, paired by seed (95 % t-interval)",
    )
    _save(figure, path)
