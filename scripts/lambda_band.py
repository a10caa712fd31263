"""λ in band in the committed tabular and synthetic tables: each MATk/STk cell's (column's) selected
setting retrained on one split (repeat), recording the λ every training call used
(:mod:`topklab.losses.aggregate.loss_stream`), into results/bench/lambda_band_cpu.{json,md}.

    python scripts/lambda_band.py                     # every full-preset tabular cell and Table 2 column
    python scripts/lambda_band.py tabular=false       # the synthetic columns only

These tables train λ with the paper's update (SGD-STk at the members' own rate, λ₀ = 0 for the
tabular protocol and the k-th initial loss for Table 2); a row whose λ was in band on fewer than
half of its steps is named as degenerate.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import hydra
import torch
from hydra import compose
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import topklab.launch  # noqa: E402,F401  (registers Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.losses.aggregate.lambda_monitor import FLAG_BELOW, PARTLY_BELOW  # noqa: E402
from topklab.protocol.recording import record_cell  # noqa: E402
from topklab.report import make_result, write_result  # noqa: E402
from topklab.synthetic.experiment import columns_of  # noqa: E402
from topklab.synthetic.recording import record_column  # noqa: E402
from topklab.utils.errors import TopklabError, fail  # noqa: E402
from topklab.utils.io import atomic_write_text  # noqa: E402
from topklab.utils.provenance import collect, portable_config  # noqa: E402

SMOOTHING_OF = {"matk": "relu"}


def tabular_rows(preset: str) -> list[dict]:
    rows = []
    for cell_file in sorted((ROOT / "results" / "tabular" / preset).glob("table*/*/*-*.json")):
        aggregate = cell_file.stem.rsplit("-", 1)[1]
        if aggregate not in ("matk", "stk"):
            continue
        stream = record_cell(cell_file, ROOT)
        setting = stream.source["setting"]
        delta = setting["delta"] if aggregate == "stk" else None
        smoothing = SMOOTHING_OF.get(aggregate, "srelu")
        rows.append(
            {
                "family": "tabular",
                "row": str(cell_file.relative_to(ROOT / "results" / "tabular" / preset)),
                "aggregate": aggregate,
                "setting": setting,
                "calls": len(stream.steps),
                **_band(stream, setting["k"], smoothing, delta),
            }
        )
        _say(rows[-1])
    return rows


def synthetic_rows(table: str) -> list[dict]:
    cfg = compose("reproduce_synthetic")
    stored = json.loads((ROOT / "results" / "synthetic" / f"{table}.json").read_text())["result"]["columns"]
    rows = []
    for row in cfg.table2.columns:
        label, column = next(iter(columns_of([row]).items()))
        if not column.uses_lambda:
            continue
        k = stored[label]["k"]
        stream = record_column(cfg, column, k)
        smoothing = column.overrides.get("smoothing", "relu") if column.aggregate == "stk" else "relu"
        delta = stream.source["setting"]["delta"] if smoothing == "srelu" else None
        rows.append(
            {
                "family": "synthetic",
                "row": f"{table}: {label}",
                "aggregate": column.aggregate,
                "setting": {**stream.source["setting"], "smoothing": smoothing},
                "calls": len(stream.steps),
                **_band(stream, k, smoothing, delta),
            }
        )
        _say(rows[-1])
    return rows


def _band(stream, k, smoothing: str, delta) -> dict:
    return {
        "in_band": stream.recorded_in_band(k, smoothing, delta),
        "optimum_in_band": stream.recorded_in_band(k, smoothing, delta, optimal=True),
        "share_below": stream.recorded_share_below(),
    }


def verdict(row: dict) -> str:
    """How a row's λ did: "k = n" (Average by definition), "tracked", "did not track" (λ out of band
    where the batch's own optimum is in band), "unattainable" (ties keep even the optimum out of band),
    or "tracked (optimum not defined)" for ELU / SoftPlus / Leaky-ReLU."""
    if row["in_band"] is None:
        return "k = n"
    if row["in_band"] >= FLAG_BELOW:
        return "tracked"
    if row["optimum_in_band"] is not None and row["optimum_in_band"] < FLAG_BELOW:
        return "unattainable (ties at ℓ_[k])"
    return "did not track"


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def _say(row: dict) -> None:
    print(
        f"{row['row']}: λ in band {_fmt(row['in_band'])}, optimum {_fmt(row['optimum_in_band'])} over "
        f"{row['calls']} calls: {verdict(row)}",
        flush=True,
    )


def counts(rows: list[dict], what: str) -> str:
    """One line of counts over ``rows`` (one table family): how many, how many at k = n, and over those
    with k < n the in-band shares' min, median and max and how many are at ≥ 0.9, between 0.5 and 0.9
    (partly tracked) and below 0.5."""
    values = sorted(r["in_band"] for r in rows if r["in_band"] is not None)
    whole = len(rows) - len(values)
    if not values:
        return f"{what}: {len(rows)}, all at k = n."
    partly = sum(FLAG_BELOW <= v < PARTLY_BELOW for v in values)
    return (
        f"{what}: {len(rows)}, {whole} at k = n (Average by definition); over the {len(values)} with k < n, λ in band "
        f"min {values[0]:.3f}, median {statistics.median(values):.3f}, max {values[-1]:.3f}: "
        f"{sum(v >= PARTLY_BELOW for v in values)} at ≥ {PARTLY_BELOW}, {partly} partly ({FLAG_BELOW}–{PARTLY_BELOW}), "
        f"{sum(v < FLAG_BELOW for v in values)} below {FLAG_BELOW}."
    )


def render(rows: list[dict], command: str) -> str:
    by_verdict = {
        v: [r["row"] for r in rows if verdict(r) == v] for v in ("did not track", "unattainable (ties at ℓ_[k])")
    }
    partly = [r["row"] for r in rows if r["in_band"] is not None and FLAG_BELOW <= r["in_band"] < PARTLY_BELOW]
    tabular, synthetic = ([r for r in rows if r["family"] == family] for family in ("tabular", "synthetic"))
    lines = [
        "# λ in band in the committed tabular and synthetic tables (the paper's update)",
        "",
        f"`{command}`: each MATk/STk cell's selected setting retrained on split 0 (Table 2: repeat 0 at the column's "
        f"selected k), recording the λ every training call used. λ in band: the share of calls after the first 10 % "
        f"whose smoothed share above λ (the mean of φ'(ℓ − λ); MATk: the hard share) is within a factor 2 of k/n and "
        f"its complement within a factor 2 of 1 − k/n. *Optimum in band*: the same for each batch's own optimal λ* "
        f"(STk: the root of its equation; MATk: the midpoint of ℓ_[k+1] and ℓ_[k]); where it is out of band too, "
        f"ties at ℓ_[k] (hinge losses at exactly 0, batches of 16) make the band unreachable and the row is not a "
        f"tracking failure. For ELU and SoftPlus the smoothing's slope is wide, so their smoothed share can be in "
        f"band while the hard share below λ is far from 1 − k/n. k = n (the whole batch) is Average by definition.",
        "",
        counts(tabular, "Tables 3, 4 and 6, cells") + "  ",
        counts(synthetic, "Table 2, columns") + "  ",
        f"**λ did not track (flagged):** {', '.join(by_verdict['did not track']) or 'none'}.  ",
        f"**λ partly tracked ({FLAG_BELOW}–{PARTLY_BELOW}):** {', '.join(partly) or 'none'}.  ",
        f"**Band unattainable (ties):** {', '.join(by_verdict['unattainable (ties at ℓ_[k])']) or 'none'}.",
        "",
        "| row | aggregate | k | δ | η | calls | λ in band | optimum in band | share below λ | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["setting"]
        delta = s.get("delta") if r["aggregate"] == "stk" and s.get("smoothing", "srelu") == "srelu" else "—"
        lines.append(
            f"| {r['row']} | {r['aggregate']} | {s['k']} | {delta} | {s['lr']} | {r['calls']} | "
            f"{_fmt(r['in_band'])} | {_fmt(r['optimum_in_band'])} | {r['share_below']:.3f} | {verdict(r)} |"
        )
    return "\n".join(lines) + "\n"


@hydra.main(config_path="../configs", config_name="lambda_band", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out = Path(cfg.out_dir)
    if cfg.render_only:  # the table again from the stored rows and their command
        stored = json.loads((out / "lambda_band_cpu.json").read_text())
        atomic_write_text(out / "lambda_band_cpu.md", render(stored["result"]["rows"], stored["command"]))
        print(f"wrote {out / 'lambda_band_cpu.md'} from {out / 'lambda_band_cpu.json'}")
        return
    torch.set_num_threads(int(cfg.threads) or torch.get_num_threads())
    rows = (tabular_rows(cfg.preset) if cfg.tabular else []) + (
        synthetic_rows(cfg.synthetic_table) if cfg.synthetic else []
    )
    if not rows:
        raise TopklabError("nothing selected: set tabular=true or synthetic=true")
    command = "python scripts/lambda_band.py" + "".join(f" {a}" for a in sys.argv[1:])
    config = {k: v for k, v in portable_config(cfg).items() if k not in ("out_dir", "render_only")}  # a machine path
    result = make_result(
        "bench", "lambda_band", {"rows": rows}, command=command, config=config, provenance=collect(ROOT)
    )
    write_result(out / "lambda_band_cpu.json", result)
    atomic_write_text(out / "lambda_band_cpu.md", render(rows, command))
    print(f"wrote {out / 'lambda_band_cpu.md'}")


if __name__ == "__main__":
    try:
        main()
    except TopklabError as err:
        fail(err)
