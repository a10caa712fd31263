"""Record the replay (:mod:`topklab.protocol.replay`) of every stored tabular cell that lacks one,
under the training source that trained it: the commit in the cell's provenance, checked out as a
git worktree. A cell file gains ``result.replay`` and nothing else; its numbers are not retrained.

    python scripts/record_cell_replays.py [--results results/tabular] [--worktrees /tmp]

A cell whose provenance names no commit, or a tree that was dirty, gets no replay: under other
training source it retrains (``protocol.reproduce``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLAY_MODULE = ROOT / "src" / "topklab" / "protocol" / "replay.py"


def replay_files(files: list[str], data_dir: str) -> dict[str, str]:
    """The replay digest of each cell file, under the ``topklab`` this process imports (the cell's
    own commit): dataset and individual loss from the stored fingerprint, the protocol's fields from
    it too, the aggregate as that commit's ``run_cell`` builds it by default."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    spec = importlib.util.spec_from_file_location("cell_replay", REPLAY_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    digests = {}
    for file in files:
        stored = json.loads(Path(file).read_text())
        fingerprint, result = stored["config"], stored["result"]
        nodes = OmegaConf.create({"paths": {"data_dir": data_dir}, **fingerprint})
        fields = {k: v for k, v in fingerprint["protocol"].items() if k != "grid"}
        grid = module.Grid(**{axis: [result["selected"][axis]] for axis in ("k", "C", "lr", "delta")})
        digests[file] = module.replay(
            module.Cell(**result["cell"]),
            instantiate(nodes.dataset),
            instantiate(nodes.individual),
            module.Protocol(grid=grid, **fields),
            result["selected"],
        )
    return digests


def worktree(commit: str, under: Path) -> Path:
    """A clean git worktree of ``commit`` under ``under``, reading this checkout's ``.data``."""
    path = under / f"topklab-replay-{commit[:12]}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True)
    data = path / ".data"
    if not data.exists():
        data.symlink_to((ROOT / ".data").resolve())
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout
    if dirty:
        raise SystemExit(f"error: {path} has changes to tracked files; remove it (git worktree remove) and rerun")
    return path


def record(results: Path, worktrees: Path) -> None:
    from topklab.engine.run_identity import code_version
    from topklab.protocol.replay import REPLAY_STEPS
    from topklab.report.schema import read_result, write_result

    by_commit, unrecordable = defaultdict(list), []
    for path in sorted(results.rglob("*.json")):
        stored = read_result(path, "tabular")
        if "replay" in stored["result"]:
            continue
        git = stored["provenance"].get("git") or {}
        if git.get("sha") and not git.get("dirty"):
            by_commit[git["sha"]].append(path)
        else:
            unrecordable.append(path)
    for commit, paths in by_commit.items():
        tree = worktree(commit, worktrees)
        out = subprocess.run(
            [sys.executable, __file__, "--replay", str(tree / ".data"), *map(str, paths)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree / "src"), "TOPKLAB_ROOT": str(tree)},
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise SystemExit(f"error: replaying at {commit[:12]} failed: {out.stderr.strip().splitlines()[-1]}")
        digests = json.loads(out.stdout.strip().splitlines()[-1])
        code = code_version(tree / "src" / "topklab")
        for path in paths:
            stored = read_result(path, "tabular")
            stored["result"]["replay"] = {"code": code, "steps": REPLAY_STEPS, "losses": digests[str(path)]}
            write_result(path, stored, indent=None)
        print(f"{commit[:12]}: {len(paths)} cell(s) replayed (code {code})")
    for path in unrecordable:
        print(f"no replay (no clean commit in its provenance): {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "tabular")
    parser.add_argument("--worktrees", type=Path, default=Path("/tmp"))
    parser.add_argument("--replay", nargs="+", metavar=("DATA_DIR", "CELL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay:  # inside a cell's own commit
        data_dir, *files = args.replay
        print(json.dumps(replay_files(files, data_dir)))
        return 0
    record(args.results.resolve(), args.worktrees)
    return 0


if __name__ == "__main__":
    sys.exit(main())
