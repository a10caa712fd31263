"""Fake result envelopes for the table renderers (``report/test_tables.py``, ``integration/test_embedding_rows.py``)."""

from topklab.report import make_result, write_result


def fake_vision_run(results, table, row, label, seed, top1, top5, per_class, train_losses=None, lambda_tracking=None):
    test = {
        "top1": top1,
        "top5": top5,
        "many": per_class[0],
        "medium": per_class[1],
        "few": per_class[2],
        "per_class": per_class,
        "score": top1,
    }
    summary = {
        "metrics": {"test": test},
        "class_counts": [150, 50, 5],
        "selection": {"top1": {"test": top1}, "top5": {"test": top5 + 1.0}},
    }
    if lambda_tracking is not None:  # a thresholded run: its final λ and the monitor's verdict
        summary["lambda"], summary["lambda_tracking"] = 0.01, lambda_tracking
    if train_losses is not None:
        summary["history"] = [{"epoch": e + 1, "train_loss": loss} for e, loss in enumerate(train_losses)]
    config = {"trainer": {"epochs": 3, "batch_size": 8, "select_metrics": ["top1", "top5"]}}
    result = make_result(
        "vision",
        f"{table}/{row}",
        {"table": table, "row": row, "label": label, "summary": summary},
        f"python train.py vision={table}/{row} seed={seed}",
        config,
        {"git": {"sha": "def5678"}, "seeds": {"seed": seed}},
    )
    return write_result(results / "vision" / table / row / f"seed{seed}.json", result)
