"""Run experiment rows × seeds on a CPU resumably: a (row, seed) whose result file is already stored
is skipped, the others run ``--jobs`` at a time (each ``OMP_NUM_THREADS=<threads> python train.py
experiment=<row> seed=<k>``, its output in ``<logs>/<row>/seed<k>.log``), seed by seed so that a sweep
cut short leaves whole seeds to pair; a failed job is listed at the end and never stops the others.

    python scripts/run_sweep.py 'fmnistlt_full/*' --jobs 2          # each row's declared seeds (result.seeds)
    python scripts/run_sweep.py fmnistlt_full/la fmnistlt_full/la_stk --seeds 5 6 --dry-run

Without ``--seeds`` a row runs seeds 0 … n − 1 of the count its group declares (``result.seeds`` in the
group's ``_common.yaml``, the count the report pairs and lists as missing).

Exit status 0 when every job ran (or was stored), 1 when one failed, 2 after a one-line error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from topklab.engine.result_guard import result_path, row_filing  # noqa: E402
from topklab.utils.errors import TopklabError  # noqa: E402


def expand_rows(patterns: list[str], config_dir: Path = ROOT / "configs") -> list[str]:
    """The experiment rows that ``patterns`` name (globs under ``configs/experiment/``, shared parts
    ``_*.yaml`` left out), in order, each once.

    Examples
    --------
    >>> expand_rows(["fmnistlt_full/la_stk*"])
    ['fmnistlt_full/la_stk', 'fmnistlt_full/la_stk_k50', 'fmnistlt_full/la_stk_k70', 'fmnistlt_full/la_stk_k96']
    """
    experiments = config_dir / "experiment"
    rows: list[str] = []
    for pattern in patterns:
        found = sorted(
            p.relative_to(experiments).with_suffix("").as_posix()
            for p in experiments.glob(f"{pattern}.yaml")
            if not p.name.startswith("_")
        )
        if not found:
            raise TopklabError(f"no experiment row matches {pattern!r} under {experiments}")
        rows += [row for row in found if row not in rows]
    return rows


def filing(row: str) -> dict:
    """What ``train.py experiment=<row>`` files its result as (its ``result`` block, composed as
    train.py composes it: :func:`~topklab.engine.result_guard.row_filing`), with ``seeds``, the seed count
    its group declares (None when it declares none)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={row}"])
    filed = row_filing(cfg.get("result"), row)
    if filed is None:
        raise TopklabError(f"experiment {row} files no result (no result block); the sweep cannot tell when it is done")
    return {**filed, "seeds": cfg.result.get("seeds")}


def seeds_of(row: str, filed: dict, asked: list[int] | None) -> list[int]:
    """The seeds to run for ``row``: those asked for, else 0 … n − 1 of its declared count."""
    if asked is not None:
        return asked
    if not filed.get("seeds"):
        raise TopklabError(f"{row} declares no seed count (result.seeds in its group's _common.yaml); pass --seeds")
    return list(range(filed["seeds"]))


def run_job(row: str, seed: int, threads: int, logs: Path) -> tuple[int, float]:
    """``(exit status, seconds)`` of one ``train.py`` run, its output in ``<logs>/<row>/seed<seed>.log``."""
    log = logs / row / f"seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # train.py runs torch at this many threads
    start = time.perf_counter()
    with log.open("w") as out:
        command = [sys.executable, "train.py", f"experiment={row}", f"seed={seed}"]  # run in ROOT: a portable argv
        status = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return status, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/run_sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", help="experiment rows or globs under configs/experiment/")
    parser.add_argument("--seeds", nargs="+", type=int, help="default: each row's declared seed count")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--logs", type=Path, default=ROOT / "outputs" / "sweeps", help="one log per run")
    parser.add_argument("--dry-run", action="store_true", help="list what would run and what is stored")
    args = parser.parse_args(argv)
    try:
        if args.jobs < 1 or args.threads < 1:
            raise TopklabError(f"--jobs={args.jobs}, --threads={args.threads}: both must be >= 1")
        rows = expand_rows(args.rows)
        filings = {row: filing(row) for row in rows}
        seeds = {row: seeds_of(row, filings[row], args.seeds) for row in rows}
        files = {(row, seed): result_path(ROOT, filings[row], seed) for row in rows for seed in seeds[row]}
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    every_seed = sorted({seed for row in rows for seed in seeds[row]})
    todo = [(row, seed) for seed in every_seed for row in rows if seed in seeds[row] and not files[row, seed].is_file()]
    print(f"{len(files) - len(todo)} of {len(files)} runs stored; {len(todo)} to run", flush=True)
    if args.dry_run:
        for row, seed in todo:
            print(f"  python train.py experiment={row} seed={seed}   -> {files[row, seed].relative_to(ROOT)}")
        return 0

    def job(key):
        status, seconds = run_job(*key, args.threads, args.logs)
        print(f"{'ok' if status == 0 else f'FAILED ({status})'}: {key[0]} seed {key[1]}, {seconds:.0f} s", flush=True)
        return key, status

    with ThreadPoolExecutor(args.jobs) as pool:
        failed = [key for key, status in pool.map(job, todo) if status != 0]
    for row, seed in failed:
        print(f"failed: {row} seed {seed} (log: {args.logs / row / f'seed{seed}.log'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
