"""λ in band in the result tables: the share of a MATk/STk run's training steps at which λ tracked
the k-th largest loss (:mod:`topklab.losses.aggregate.lambda_monitor`), and the rows it flags.

The tables read each run's stored ``lambda_tracking`` (its ``in_band``, ``judged_on`` and ``flag``)
as the run wrote it; nothing is recomputed from a run's history."""

from __future__ import annotations

from topklab.losses.aggregate.lambda_monitor import ALL_STEPS, PARTLY_BELOW, PARTLY_TRACKED_FLAG
from topklab.report.stats import mean_std


def not_stk(tracking: dict) -> bool:
    """Whether a run's stored ``lambda_tracking`` carries a flag other than :data:`PARTLY_TRACKED_FLAG`
    (λ did not track: the run is not STk).

    Examples
    --------
    >>> not_stk({"flag": "λ did not track the k-th loss: this row is not STk"}), not_stk({"flag": None})
    (True, False)
    >>> not_stk({"flag": "λ partly tracked the k-th loss"})
    False
    """
    return bool(tracking.get("flag")) and tracking["flag"] != PARTLY_TRACKED_FLAG


def band_cell(summaries: list[dict]) -> str:
    """λ in band over a row's seeds: "—" without a threshold, "not logged" for runs from before the
    diagnostic, the value (mean ± std over seeds) otherwise, marked "all steps" when a seed stopped
    within its burn-in (judged on all its steps), "flagged" when a seed's λ did not track, else
    "partly tracked" when a seed's λ partly tracked.

    Examples
    --------
    >>> band_cell([{"lambda": None}]), band_cell([{"lambda": 1.0}])
    ('—', 'not logged')
    >>> band_cell([{"lambda": 1.0, "lambda_tracking": {"in_band": 0.1, "flag": "λ did not track"}}])
    '0.10 (flagged)'
    >>> band_cell([{"lambda": 1.0, "lambda_tracking": {"in_band": 0.6, "flag": "λ partly tracked the k-th loss"}}])
    '0.60 (partly tracked)'
    >>> band_cell([{"lambda": 1.0, "lambda_tracking": {"in_band": 0.2, "judged_on": "all steps", "flag": "λ did not track"}}])
    '0.20 (all steps, flagged)'
    """
    if all(s.get("lambda") is None for s in summaries):
        return "—"
    tracking = [s.get("lambda_tracking") or {} for s in summaries]
    values = [t.get("in_band") for t in tracking if t.get("in_band") is not None]
    if not values:
        return "not logged"
    text = f"{values[0]:.2f}" if len(values) == 1 else "{:.2f} ± {:.2f}".format(*mean_std(values))
    marks = [ALL_STEPS] if any(t.get("judged_on") == ALL_STEPS for t in tracking) else []
    if any(not_stk(t) for t in tracking):
        marks.append("flagged")
    elif any(t.get("flag") == PARTLY_TRACKED_FLAG for t in tracking):
        marks.append("partly tracked")
    return text + (f" ({', '.join(marks)})" if marks else "")


def hard_share_cell(summaries: list[dict]) -> str:
    """The hard share over a row's seeds (the share of the last epoch's losses above λ, beside the smoothed
    share that "λ in band" judges): "—" without a threshold, "not logged" for runs from before the
    diagnostic, the value to three decimals (mean ± std over seeds) otherwise. 1.000 on every seed means
    λ sat below every loss: the row dropped no sample.

    Examples
    --------
    >>> hard_share_cell([{"lambda": None}]), hard_share_cell([{"lambda": 1.0}])
    ('—', 'not logged')
    >>> hard_share_cell([{"lambda": 1.0, "lambda_tracking": {"hard_share": h}} for h in (1.0, 1.0)])
    '1.000 ± 0.000'
    >>> hard_share_cell([{"lambda": 1.0, "lambda_tracking": {"hard_share": 0.5}}])
    '0.500'
    """
    values = _hard_shares(summaries)
    if values is None:
        return "—"
    if not values:
        return "not logged"
    return f"{values[0]:.3f}" if len(values) == 1 else "{:.3f} ± {:.3f}".format(*mean_std(values))


def _hard_shares(summaries: list[dict]) -> list[float] | None:
    if all(s.get("lambda") is None for s in summaries):
        return None
    tracking = [s.get("lambda_tracking") or {} for s in summaries]
    return [t["hard_share"] for t in tracking if t.get("hard_share") is not None]


def below_every_loss_rows(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The labels of the rows whose λ sat below every loss of the last epoch on every seed (hard share
    exactly 1)."""
    below = []
    for row, runs in rows.items():
        values = _hard_shares([r["result"]["summary"] for r in runs])
        if values and len(values) == len(runs) and all(v == 1.0 for v in values):
            below.append(labels[row])
    return below


def below_every_loss_lines(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The note under a table naming the rows whose λ sat below every loss (none when there are none)."""
    below = below_every_loss_rows(rows, labels)
    if not below:
        return []
    return [
        "",
        f"**λ below every loss** (hard share 1.000 on every seed, last epoch): {'; '.join(below)}. These rows drop "
        "no sample: with λ under every loss, the thresholded loss is the average with its smallest losses softly "
        "down-weighted by the smoothing, while the smoothed share (what λ in band judges) can still be in band.",
    ]


def flagged_rows(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The labels of the rows with a seed whose λ did not track."""
    return [labels[row] for row, runs in rows.items() if any(not_stk(_tracking(r)) for r in runs)]


def partly_tracked_rows(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The labels of the rows with a seed whose λ partly tracked and none whose λ did not track."""
    return [
        labels[row]
        for row, runs in rows.items()
        if any(_tracking(r).get("flag") == PARTLY_TRACKED_FLAG for r in runs)
        and not any(not_stk(_tracking(r)) for r in runs)
    ]


def flag_lines(rows: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
    """The note under a table naming its flagged rows (none when no row is flagged): the rows whose λ
    did not track (not STk), then those whose λ partly tracked."""
    lines = []
    flagged = flagged_rows(rows, labels)
    if flagged:
        lines += ["", f"**λ did not track the k-th loss, so these rows are not STk:** {', '.join(flagged)}."]
    partly = partly_tracked_rows(rows, labels)
    if partly:
        share = f"in band on fewer than {round(PARTLY_BELOW * 100)} % of the steps"
        lines += ["", f"**λ partly tracked the k-th loss ({share}):** {', '.join(partly)}."]
    return lines


def _tracking(result: dict) -> dict:
    return result["result"]["summary"].get("lambda_tracking") or {}
