"""Convert result files of the older shapes under results/ to the one envelope of
topklab.report.schema (nothing is rerun; numbers are copied as they are). Idempotent: files already
in the envelope are only checked.

    python scripts/convert_results.py [--results results] [--check]

- tabular/<preset>/<table>/<dataset>/<loss>-<aggregate>.json: family "tabular" (fingerprint -> config)
- synthetic/{table2,figure3,figure4}.json: family "synthetic"
- synthetic/table1.json -> bench/table1.json: family "bench" (Table 1 is a timing benchmark)
- vision/<table>/<row>/seed<k>.json: family "vision", payload {table, row, label (config.row), summary}
- bench/{topk,loader}_<device>.json: family "bench"

--check writes nothing and exits 1 if any file still needs converting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

from topklab.protocol.store import to_result  # noqa: E402
from topklab.report.schema import make_result, read_result, write_result  # noqa: E402
from topklab.utils.errors import TopklabError  # noqa: E402

RUN_KEYS = ("command", "provenance")


def _rest(old: dict, *drop: str) -> dict:
    return {k: v for k, v in old.items() if k not in drop}


def tabular(rel: PurePosixPath, old: dict) -> tuple[PurePosixPath, dict]:
    return rel, to_result(old)


def synthetic(rel: PurePosixPath, old: dict) -> tuple[PurePosixPath, dict]:
    payload = _rest(old, "experiment", "config", *RUN_KEYS)
    return rel, make_result("synthetic", old["experiment"], payload, old["command"], old["config"], old["provenance"])


def table1(rel: PurePosixPath, old: dict) -> tuple[PurePosixPath, dict]:
    payload = {k: old[k] for k in ("algorithms", "order")}
    config = _rest(old, *payload, *RUN_KEYS)  # n, k, runs, seed, lr, delta, tol, threads
    return PurePosixPath("bench/table1.json"), make_result(
        "bench", "table1", payload, old["command"], config, old["provenance"]
    )


def bench(rel: PurePosixPath, old: dict) -> tuple[PurePosixPath, dict]:
    payload = {k: old[k] for k in ("results", "ratio") if k in old}
    config = _rest(old, *payload, *RUN_KEYS)  # loader: images, batch_size, epochs; topk: none recorded
    return rel, make_result("bench", rel.stem, payload, old["command"], config, old["provenance"])


def vision(rel: PurePosixPath, old: dict) -> tuple[PurePosixPath, dict]:
    _, table, row, _ = rel.parts
    payload = {"table": table, "row": row, "label": old["config"].get("row") or row, "summary": old["summary"]}
    return rel, make_result("vision", f"{table}/{row}", payload, old["command"], old["config"], old["provenance"])


def _matches(rel: PurePosixPath, pattern: str) -> bool:
    return len(rel.parts) == len(PurePosixPath(pattern).parts) and rel.match(pattern)


# first matching pattern wins (relative to results/)
CONVERTERS = (
    ("tabular/*/*/*/*.json", tabular),
    ("synthetic/table1.json", table1),
    ("synthetic/*.json", synthetic),
    ("vision/*/*/seed*.json", vision),
    ("bench/*.json", bench),
)


def convert(results: Path, check: bool = False) -> tuple[list[str], int]:
    """Convert every old-format result under ``results``; return (the files converted, the
    number already in the envelope). With ``check``, write nothing.

    Examples
    --------
    >>> convert(Path("results"))  # doctest: +SKIP
    ([], 214)
    """
    converted, current = [], 0
    for path in sorted(results.rglob("*.json")):
        rel = PurePosixPath(path.relative_to(results).as_posix())
        try:
            old = json.loads(path.read_text())
        except ValueError as err:
            raise TopklabError(f"{path} is not valid JSON ({err}); restore it from git") from None
        if isinstance(old, dict) and "schema" in old:
            read_result(path)  # already converted: only checked
            current += 1
            continue
        converter = next((c for pattern, c in CONVERTERS if _matches(rel, pattern)), None)
        if converter is None:
            raise TopklabError(
                f"{path} is no result file this script knows; move it out of {results} or "
                f"convert it by hand to the envelope of topklab.report.schema"
            )
        try:
            new_rel, result = converter(rel, old)
        except KeyError as err:
            raise TopklabError(f"{path} lacks {err} for a {converter.__name__} result; restore it from git") from None
        converted.append(f"{rel} -> {new_rel}" if new_rel != rel else str(rel))
        if not check:
            write_result(results / new_rel, result, indent=None if result["family"] == "tabular" else 2)
            if new_rel != rel:
                path.unlink()
    return converted, current


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file needs converting")
    args = parser.parse_args(argv)
    try:
        converted, current = convert(args.results, args.check)
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in converted:
        print(("needs converting: " if args.check else "converted: ") + line)
    print(f"{len(converted)} file(s) {'to convert' if args.check else 'converted'}, {current} already in the envelope")
    return 1 if args.check and converted else 0


if __name__ == "__main__":
    sys.exit(main())
