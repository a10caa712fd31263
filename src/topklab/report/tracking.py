"""λ in band in the result tables: the share of a MATk/STk run's training steps at which λ tracked
the k-th largest loss (:mod:`topklab.losses.aggregate.lambda_monitor`), and the rows it flags."""

from __future__ import annotations

from topklab.report.stats import mean_std


def band_cell(summaries: list[dict]) -> str:
    """λ in band over a row's seeds: "—" without a threshold, "not logged" for runs from before the
    diagnostic, the value (mean ± std over seeds) otherwise, flagged when any seed is flagged.

    Examples
    --------
    >>> band_cell([{"lambda": None}]), band_cell([{"lambda": 1.0}])
    ('—', 'not logged')
    >>> band_cell([{"lambda": 1.0, "lambda_tracking": {"in_band": 0.1, "flag": "λ did not track"}}])
    '0.10 (flagged)'
    """
    if all(s.get("lambda") is None for s in summaries):
        return "—"
    tracking = [s.get("lambda_tracking") or {} for s in summaries]
    values = [t.get("in_band") for t in tracking if t.get("in_band") is not None]
    if not values:
        return "not logged"
    text = f"{values[0]:.2f}" if len(values) == 1 else "{:.2f} ± {:.2f}".format(*mean_std(values))
    return text + (" (flagged)" if any(t.get("flag") for t in tracking) else "")


def flagged_rows(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The labels of the rows with a seed whose λ did not track."""
    return [
        labels[row]
        for row, runs in rows.items()
        if any((r["result"]["summary"].get("lambda_tracking") or {}).get("flag") for r in runs)
    ]
