"""Runs that diverged, kept out of a table's means and named under it.

A run diverged when the mean training loss of one of its epochs rose above :data:`SPIKE_FACTOR`
times the lowest epoch mean before it: SGD had left the basin it was descending (a loss spike), and
what it reports afterwards measures the recovery, not the loss it trains. The test reads only the
run's own training loss (its stored per-epoch ``history``), never the metric the table reports, so
that dropping a run cannot select on its outcome. Runs without a history are never flagged.
"""

from __future__ import annotations

from topklab.utils.errors import TopklabError

SPIKE_FACTOR = 2.0  # no committed vision run without a collapse rises above 1.8 × its lowest earlier epoch


def loss_spike(history: list[dict], factor: float = SPIKE_FACTOR) -> dict | None:
    """The first epoch whose mean training loss exceeds ``factor`` × the lowest mean of the epochs
    before it, as ``{"epoch", "train_loss", "lowest_before"}``; None when there is none.

    Parameters
    ----------
    history : per-epoch records with ``epoch`` and ``train_loss`` (a result's ``summary["history"]``)
    factor : float > 1, the rise that counts as a spike

    Examples
    --------
    >>> h = [{"epoch": 1, "train_loss": 2.7}, {"epoch": 2, "train_loss": 1.5}, {"epoch": 3, "train_loss": 3.6}]
    >>> loss_spike(h)
    {'epoch': 3, 'train_loss': 3.6, 'lowest_before': 1.5}
    >>> loss_spike(h, factor=3.0) is None
    True
    """
    if not factor > 1:
        raise TopklabError(f"divergence factor={factor} must be > 1 (the rise of the training loss that counts)")
    lowest = None
    for record in history:
        loss = record.get("train_loss")
        if loss is None:
            continue
        if lowest is not None and loss > factor * lowest:
            return {"epoch": record["epoch"], "train_loss": loss, "lowest_before": lowest}
        lowest = loss if lowest is None else min(lowest, loss)
    return None


def diverged(result: dict, factor: float = SPIKE_FACTOR) -> dict | None:
    """:func:`loss_spike` of a stored result (``result.summary.history``); None without a history."""
    return loss_spike(result["result"]["summary"].get("history") or [], factor)


def divergence_lines(rows: dict[str, list[dict]], labels: dict[str, str], seed_of) -> list[str]:
    """The note under a table naming each diverged run (none when no run diverged): its row, seed,
    spike epoch and reported top-1, and that the row's means leave it out.

    Examples
    --------
    >>> run = {"provenance": {"seeds": {"seed": 4}}, "result": {"summary": {
    ...     "selection": {"top1": {"test": 31.6}},
    ...     "history": [{"epoch": 3, "train_loss": 1.48}, {"epoch": 4, "train_loss": 3.62}]}}}
    >>> print(divergence_lines({"a": [run]}, {"a": "A"}, lambda r: 4)[1])
    **Diverged runs, left out of the means (training loss above 2 × its lowest earlier epoch):** A seed 4 (epoch 4: 3.62 after 1.48; top-1 31.60).
    """
    named = []
    for row, runs in rows.items():
        for run in runs:
            spike = diverged(run)
            if spike:
                top1 = run["result"]["summary"].get("selection", {}).get("top1", {}).get("test")
                named.append(
                    f"{labels[row]} seed {seed_of(run)} (epoch {spike['epoch']}: {spike['train_loss']:.2f} after "
                    f"{spike['lowest_before']:.2f}" + ("" if top1 is None else f"; top-1 {top1:.2f}") + ")"
                )
    if not named:
        return []
    return [
        "",
        f"**Diverged runs, left out of the means (training loss above {SPIKE_FACTOR:g} × its lowest earlier epoch):** "
        + ", ".join(named)
        + ".",
    ]
