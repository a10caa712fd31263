"""The pictures beside the result tables, each drawn from committed results only.

- :func:`lambda_against_kth`: λ and the batch's k-th loss per epoch for every row of a table that
  logs λ (a tracked row beside one whose λ did not track).
- :func:`seed_strips`: each seed's test value per row, the mean marked, beside a table of means.
- :func:`cost_against_n`: forward + backward time against n, one panel per benchmark file.
- :func:`operator_times`: the soft top-k operators' time against n.
- :func:`routed_share_per_layer`: the share of tokens each routed layer processed, per row.
- :func:`difference_against_k`: a k sweep's paired difference from its baseline against k/n.

Each names its data (the table or benchmark), the device it ran on (:func:`device_of`) and, for a row
that aggregates a share of the losses, its k/n (:func:`row_label`); a figure's labels are laid out
where they cannot collide (counts in the legend, not beside points; long titles on two lines), which
``tests/report/test_figures_readable.py`` checks on every figure drawn.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from topklab.report.tracking import not_stk  # noqa: E402

MARKERS = "os^vDP*Xh<>p"
LAMBDA_KEYS = ("lambda", "lam_minus_kth")
PEER_MARKER = "x"  # a peer's implementation, beside ours (operators.png)


def colors(count: int) -> list:
    """``count`` colours, distinct up to 20: matplotlib's ten, or its twenty where more are drawn."""
    palette = plt.get_cmap("tab10" if count <= 10 else "tab20").colors
    return [palette[i % len(palette)] for i in range(count)]


def device_of(runs: list[dict]) -> str:
    """Where ``runs`` ran, as a figure names it: the GPU's name, or "CPU" with its thread count.

    Examples
    --------
    >>> run = lambda gpus, device, threads: {"provenance": {"hardware": {"gpus": gpus, "torch_threads": threads}},
    ...                                      "result": {"summary": {"device": device}}}
    >>> device_of([run([], "cpu", 1), run([], "cpu", 1)])
    'CPU, 1 thread'
    >>> device_of([run(["NVIDIA H100 80GB HBM3"], "cuda", 16)])
    'NVIDIA H100 80GB HBM3'
    """
    names = []
    for run in runs:
        hardware = (run.get("provenance") or {}).get("hardware") or {}
        result = run.get("result") if isinstance(run.get("result"), dict) else {}
        summary = result.get("summary") if isinstance(result.get("summary"), dict) else {}
        device = summary.get("device") or result.get("device")
        if hardware.get("gpus") and device != "cpu":
            names.append(hardware["gpus"][0])
        else:
            threads = hardware.get("torch_threads")
            names.append("CPU" if threads is None else f"CPU, {threads} thread{'s' * (threads != 1)}")
    return " / ".join(dict.fromkeys(names)) or "device not recorded"


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def row_label(runs: list[dict]) -> str:
    """A row's label, with its k/n where the row aggregates a share of the losses (ATk, STk) and its
    label does not say it.

    Examples
    --------
    >>> run = lambda label, k: {"result": {"label": label}, "config": {"loss": {"k": k}}}
    >>> row_label([run("STk", 0.96)]), row_label([run("LA + ATk, k/n = 0.50", 0.5)]), row_label([run("LA", None)])
    ('STk, k/n = 0.96', 'LA + ATk, k/n = 0.50', 'LA')
    """
    label = runs[0]["result"]["label"]
    k = ((runs[0].get("config") or {}).get("loss") or {}).get("k")
    if "k/n" in label or not isinstance(k, float) or not 0 < k <= 1:
        return label
    return f"{label}, k/n = {k:.2f}"


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
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    device = device_of([r for runs in rows.values() for r in runs])
    for index, runs in enumerate(lambda_rows(rows).values()):
        color = f"C{index}"
        flagged = any(not_stk(r["result"]["summary"].get("lambda_tracking") or {}) for r in runs)
        name = row_label(runs) + (" (flagged: λ did not track)" if flagged else "")
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
    figure.suptitle(f"{title} ({device}): λ against the batch's k-th loss, one line per seed")
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
    figure, axis = plt.subplots(figsize=(6.5, 0.5 * len(rows) + 1.7))
    device = device_of([r for runs in rows.values() for r in runs])
    names = []
    any_diverged = False
    for position, runs in enumerate(reversed(list(rows.values()))):
        kept, dropped = strip_values(runs, value)
        names.append(row_label(runs))
        axis.scatter(kept, [position] * len(kept), color="C0", alpha=0.7, zorder=3)
        if dropped:
            any_diverged = True
            axis.scatter(dropped, [position] * len(dropped), color="C3", marker="x", zorder=3)
        if kept:
            axis.plot([sum(kept) / len(kept)] * 2, [position - 0.3, position + 0.3], color="k", lw=2)
    axis.set_yticks(range(len(names)), names, fontsize=8)
    axis.title.set_fontsize(10)
    axis.set_ylim(-0.6, len(names) - 0.4)
    axis.grid(True, axis="x", alpha=0.3)
    crosses = "\n(a cross: a diverged run, left out of the mean)" if any_diverged else ""
    axis.set(xlabel=unit, title=f"{title} ({device})\neach seed (dots) and the mean (bar){crosses}")
    _save(figure, path)


def _bench_lines(axis, rows: list[dict], series, x, y, peer=lambda name: False) -> None:
    """One line per series, each its own colour (:func:`colors`); a series ``peer`` names is dotted
    with the peer marker ×, ours solid with a filled marker."""
    names = list(dict.fromkeys(map(series, rows)))
    for index, (name, color) in enumerate(zip(names, colors(len(names)))):
        points = sorted((x(r), y(r)) for r in rows if series(r) == name and y(r) is not None)
        if not points:
            continue
        style = {"marker": MARKERS[index % len(MARKERS)], "ls": "-"}
        if peer(name):
            style = {"marker": PEER_MARKER, "ls": ":", "mew": 1.5}
        axis.plot(*zip(*points), ms=4, label=name, color=color, **style)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)


def cost_against_n(topk: dict[str, dict], tracked: dict | None, path: Path) -> None:
    """Time per forward + backward against n at k = 0.1n: a panel per ``topk`` benchmark
    (``{key: result of bench_topk}``, each titled with the device it ran on), and one for the
    tracked-λ kernels on a GPU (float32)."""
    panels = len(topk) + (tracked is not None)
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.4), squeeze=False)
    for axis, result in zip(axes[0], topk.values()):
        rows = [r for r in result["result"]["results"] if r["k_label"] in ("0.1n", "-")]
        _bench_lines(axis, rows, lambda r: r["loss"], lambda r: r["n"], lambda r: r["seconds"] * 1e3)
        axis.set(xlabel="n (k = 0.1n)", ylabel="forward + backward (ms)")
        axis.set_title(device_of([result]), fontsize=10)
    if tracked is not None:
        axis = axes[0][-1]
        rows = [
            {"n": r["n"], "name": name, "ms": us / 1e3}
            for r in tracked["result"]["rows"]
            if r["dtype"] == "float32" and r["k"] == "0.1"
            for name, us in r["us"].items()
        ]
        _bench_lines(axis, rows, lambda r: r["name"], lambda r: r["n"], lambda r: r["ms"])
        axis.set(xlabel="n (k = 0.1n, float32)", ylabel="forward + backward (ms)")
        axis.set_title(f"tracked λ: {tracked['result']['meta']['device']}", fontsize=10)
    figure.suptitle("cost against n: the aggregates' forward + backward on one vector of n losses")
    _save(figure, path)


def operator_times(bench: dict, path: Path) -> None:
    """Forward + backward time of each soft top-k operator against n (k = n/2, batch 1): ours solid,
    each peer's implementation (another package's, measured beside ours) dotted with the marker ×."""
    rows = [
        {"name": r["operator"], "n": s["n"], "ms": s["ms"]}
        for r in bench["result"]["rows"]
        for s in r["speed"]
        if s.get("ms") is not None and not s.get("stopped")
    ]
    peers = [
        {"name": f"peer: {p['label']} ({p['operator']})", "n": s["n"], "ms": s["peer_ms"]}
        for p in bench["result"].get("peers", [])
        for s in p["sizes"]
        if isinstance(s.get("peer_ms"), float) and not s.get("stopped")
    ]
    figure, axis = plt.subplots(figsize=(11, 5.2))
    _bench_lines(
        axis,
        rows + peers,
        lambda r: r["name"],
        lambda r: r["n"],
        lambda r: r["ms"],
        peer=lambda name: name.startswith("peer:"),
    )
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    axis.set(xlabel="n (k = n/2, batch 1)", ylabel="forward + backward (ms)")
    axis.set_title(
        f"soft top-k operators, {bench['result']['device']}: ours (solid), peers' implementations (dotted, ×)",
        fontsize=10,
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


def routed_share_per_layer(rows: dict[str, list[dict]], title: str, path: Path) -> None:
    """The test share of tokens each routed layer processed (mean over seeds): a bar per layer, a
    group per routed row (:func:`routed_shares`)."""
    routed = routed_shares(rows)
    device = device_of([r for runs in rows.values() for r in runs])
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(routed) + 1.8))
    layers = max(len(shares[0]) for shares in routed.values())
    height = 0.8 / layers
    for position, shares in enumerate(reversed(list(routed.values()))):
        means = [sum(layer) / len(layer) for layer in zip(*shares)]
        for layer, mean in enumerate(means):
            offset = position + (layers - 1 - 2 * layer) * height / 2
            axis.barh(offset, mean, height, color=f"C{layer}", label=f"layer {layer}" if position == 0 else None)
    axis.set_yticks(range(len(routed)), [row_label(rows[row]) for row in reversed(list(routed))], fontsize=7)
    axis.set_xlabel("share of tokens the layer processed (test)\ncapacity c = k/n")
    axis.set_title(f"{title} ({device})\nrouted share per layer, mean over seeds", fontsize=10)
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(fontsize=7)
    _save(figure, path)


def difference_against_k(
    series: dict[str, list[dict]], baseline: str, title: str, what: str, unit: str, device: str, path: Path
) -> None:
    """The mean paired difference from ``baseline`` against k/n, one line per series, with its 95 %
    t-interval as an error bar (none for a single seed) and each point's number of seeds in the
    series' legend entry (beside the points, the counts of two series at one k would collide).

    Parameters
    ----------
    series : ``{name: [{"k", "pairs": [(seed, difference), ...]}, ...]}``
        (:func:`topklab.report.paired.sweep_points`); points without pairs are left out, and a series
        without any, so that the series drawn keep their places and colours until its runs exist
    what, unit : the value differenced and its unit ("test top-1", "points")
    device : where the runs ran (:func:`device_of`)
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
        counts = [n for *_, n in drawn]
        seeds = (
            f"{counts[0]} seeds at every k"
            if len(set(counts)) == 1
            else "seeds " + " / ".join(f"{n} at {k:g}" for (k, *_), n in zip(drawn, counts))
        )
        axis.errorbar(
            ks, means, yerr=errors, marker=MARKERS[index], capsize=4, color=f"C{index}", label=f"{name} ({seeds})"
        )
    axis.axhline(0.0, color="gray", lw=0.8)
    axis.set_xlim(0.45, 1.0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    axis.set(xlabel="k/n (share of the batch's losses kept)", ylabel=f"{what} minus {baseline}'s ({unit})")
    axis.set_title(f"{title} ({device})\ndifference from {baseline}, paired by seed (95 % t-interval)", fontsize=10)
    _save(figure, path)
