"""The record of a sweep's failed jobs: ``FAILED.json`` in each failed job's directory and, once the
sweep has ended, ``failures.jsonl`` in the sweep's directory (one JSON object per failed job)."""

from __future__ import annotations

import json
from pathlib import Path

from topklab.utils.io import atomic_write_json, atomic_write_text

FAILED = "FAILED.json"
SUMMARY = "failures.jsonl"


def write_failure(
    job_dir: str | Path, job_num: int, overrides: list[str], err: BaseException, gpu: str | None = None
) -> Path:
    """Record in its directory that job ``job_num`` (run with ``overrides`` on ``gpu``) failed with ``err``."""
    return atomic_write_json(
        Path(job_dir) / FAILED,
        {
            "job": job_num,
            "overrides": list(overrides),
            "error": type(err).__name__,
            "reason": " ".join(str(err).split()),
            "gpu": gpu,
        },
    )


def clear_failures(sweep_dir: str | Path) -> None:
    """Remove the failure records an earlier sweep into the same directory left behind."""
    sweep_dir = Path(sweep_dir)
    for path in [*sweep_dir.rglob(FAILED), sweep_dir / SUMMARY]:
        path.unlink(missing_ok=True)


def collect_failures(sweep_dir: str | Path) -> list[dict]:
    """Every job of the sweep that failed, by job number, each with its directory (``dir``)."""
    records = [{**json.loads(p.read_text()), "dir": str(p.parent)} for p in Path(sweep_dir).rglob(FAILED)]
    return sorted(records, key=lambda r: r["job"])


def write_summary(sweep_dir: str | Path, failures: list[dict]) -> Path:
    """``failures.jsonl`` in the sweep's directory: one line per failed job."""
    return atomic_write_text(Path(sweep_dir) / SUMMARY, "".join(json.dumps(f, sort_keys=True) + "\n" for f in failures))


def failure_report(failures: list[dict], summary: Path, swept: set[str]) -> str:
    """What the sweep prints at its end: how many jobs failed, then one line per job with the
    swept overrides that identify it and its reason."""
    lines = [
        f"error: {len(failures)} job{'s' if len(failures) > 1 else ''} of the sweep failed, "
        f"the others ran to the end; records in {summary}"
    ]
    for failure in failures:
        named = [o for o in failure["overrides"] if o.split("=", 1)[0] in swept] or failure["overrides"]
        lines.append(f"  #{failure['job']} {' '.join(named)}: {failure['reason']}")
    return "\n".join(lines)
