"""One envelope for every committed result file, whatever produced it.

A result is a JSON object with exactly these fields::

    schema      1 (the version of this envelope)
    family      "tabular" | "synthetic" | "vision" | "translation" | "language_modeling" | "bench"
    experiment  the table row / experiment it belongs to, e.g. "table3/australian/logistic/stk",
                "table2", "fmnistlt/la", "table1"
    command     the command line that produced it
    config      the settings that determine its numbers (resolved, without machine paths)
    provenance  git sha, packages, hardware (``topklab.utils.provenance.collect``)
    result      the family's payload: what the renderers of ``topklab.report`` read

Files in an older shape are converted once by ``python scripts/convert_results.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePath

from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_write_text

SCHEMA = 1
FIELDS = ("schema", "family", "experiment", "command", "config", "provenance", "result")
# payload keys each family's renderers rely on (a family not listed here promises none)
PAYLOAD = {
    "tabular": ("cell", "metric", "selected", "test_mean", "test_std", "per_split", "combos", "preset"),
    "synthetic": (),
    "vision": ("table", "row", "label", "summary"),
    "translation": ("table", "row", "label", "summary"),
    "language_modeling": ("table", "row", "label", "summary"),
    "bench": (),
}
CONVERT = "run `python scripts/convert_results.py` to convert the results tree"


def _check(result: dict, where: str) -> dict:
    missing = [f for f in FIELDS if f not in result]
    if missing:
        raise TopklabError(f"{where} lacks the result field(s) {missing} (an old-format file?); {CONVERT}")
    if result["schema"] != SCHEMA:
        raise TopklabError(f"{where} has schema {result['schema']!r}, this code reads schema {SCHEMA}; {CONVERT}")
    family = result["family"]
    if family not in PAYLOAD:
        raise TopklabError(f"{where} has family {family!r}; choose one of: {', '.join(PAYLOAD)}")
    for name, kind in (("experiment", str), ("command", str), ("config", dict), ("provenance", dict), ("result", dict)):
        if not isinstance(result[name], kind) or (kind is str and not result[name]):
            raise TopklabError(
                f"{where}: {name} must be a {'non-empty ' if kind is str else ''}{kind.__name__}, "
                f"got {result[name]!r:.60}"
            )
    lacking = [k for k in PAYLOAD[family] if k not in result["result"]]
    if lacking:
        raise TopklabError(
            f"{where}: a {family} result needs the payload key(s) {lacking}; rerun the command "
            f"that wrote it ({result['command']})"
        )
    return result


LOCAL_PATH = re.compile(r"=/[^\s'\"]*")  # an override's absolute path: a folder of one machine


def without_local_paths(text: str) -> str:
    """``text`` with each absolute path an override gives (``key=/...``) written ``key=<path>``: a
    committed command names what it set, not where one machine keeps its folders.

    Examples
    --------
    >>> without_local_paths("python train.py seed=0 paths.checkpoint_dir=/scratch/ckpt 'paths.data_dir=/d x'")
    "python train.py seed=0 paths.checkpoint_dir=<path> 'paths.data_dir=<path> x'"
    """
    return LOCAL_PATH.sub("=<path>", text)


def portable_argv(argv: list[str]) -> list[str]:
    """A process's ``sys.argv`` without one machine's folders: the program by its file name (a launcher
    may give it as an absolute path), each override's absolute path as ``<path>``.

    Examples
    --------
    >>> here = Path.cwd().resolve()
    >>> portable_argv([str(here / "train.py"), "seed=0", f"paths.log_dir={here / 'logs'}"])
    ['train.py', 'seed=0', 'paths.log_dir=<path>']
    """
    if not argv:
        return []
    program, *rest = argv
    return [PurePath(program).name if program.startswith("/") else program, *map(without_local_paths, rest)]


def make_result(family: str, experiment: str, payload: dict, command: str, config: dict, provenance: dict) -> dict:
    """The envelope of one result, checked.

    Parameters
    ----------
    family : "tabular", "synthetic", "vision", "translation", "language_modeling" or "bench"
    experiment : id of the table row / experiment, e.g. ``"fmnistlt/la"`` or ``"table2"``
    payload : the family's data (see ``PAYLOAD`` for the keys a family must have)
    command : the command line that produced it (absolute paths of overrides are written ``<path>``)
    config : the settings that determine the numbers (JSON-ready)
    provenance : ``topklab.utils.provenance.collect(root)`` (its ``argv`` as ``command``)

    Examples
    --------
    >>> r = make_result("bench", "table1", {"order": []}, "python scripts/table1_topk_time.py", {"n": 10}, {})
    >>> r["schema"], r["family"], r["result"]
    (1, 'bench', {'order': []})
    """
    portable_provenance = dict(provenance)
    if "argv" in portable_provenance:
        portable_provenance["argv"] = portable_argv(portable_provenance["argv"])
    return _check(
        {
            "schema": SCHEMA,
            "family": family,
            "experiment": experiment,
            "command": without_local_paths(command),
            "config": config,
            "provenance": portable_provenance,
            "result": payload,
        },
        f"result {experiment!r}",
    )


def write_result(path: str | Path, result: dict, indent: int | None = 2) -> Path:
    """Write ``result`` (from :func:`make_result`) to ``path`` atomically, keys sorted.

    Parameters
    ----------
    path : target file; its directory is created
    result : an envelope; checked again before writing
    indent : JSON indent, or None for one compact line (the tabular cells)

    Examples
    --------
    >>> write_result("results/bench/table1.json", make_result(...))  # doctest: +SKIP
    """
    _check(result, str(path))
    separators = None if indent else (",", ":")
    return atomic_write_text(
        path, json.dumps(result, indent=indent, separators=separators, sort_keys=True, default=str) + "\n"
    )


def read_result(path: str | Path, family: str | None = None) -> dict:
    """The checked envelope stored at ``path``; a one-line TopklabError if it is corrupt, of an
    old format, or (with ``family``) of another family.

    Examples
    --------
    >>> read_result("results/synthetic/table2.json", "synthetic")["experiment"]  # doctest: +SKIP
    'table2'
    """
    try:
        result = json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise TopklabError(
            f"{path} is corrupt ({err}); delete it and rerun the command that wrote it (or restore it from git)"
        ) from None
    if not isinstance(result, dict):
        raise TopklabError(f"{path} holds a {type(result).__name__}, not a result object; {CONVERT}")
    _check(result, str(path))
    if family is not None and result["family"] != family:
        raise TopklabError(
            f"{path} is a {result['family']} result where a {family} result was expected; "
            f"move it to results/{result['family']}/"
        )
    return result


def code_versions(results: list[dict], width: int = 10) -> str:
    """The commits results came from, each marked clean or dirty (a tree with uncommitted changes).

    Examples
    --------
    >>> code_versions([{"provenance": {"git": {"sha": "0123456789abc", "dirty": False}}}])
    '0123456789 (clean tree)'
    """
    commits = sorted(
        {
            (str(r["provenance"].get("git", {}).get("sha", "?"))[:width], r["provenance"].get("git", {}).get("dirty"))
            for r in results
        },
        key=str,
    )
    mark = {False: "clean tree", True: "DIRTY tree"}
    return ", ".join(f"{sha} ({mark.get(dirty, 'tree state unknown')})" for sha, dirty in commits) or "—"


def dirty_result_files(directory: str | Path) -> list[Path]:
    """The result files under ``directory`` whose provenance says they came from a tree with
    uncommitted changes (read as plain JSON, whatever their family; unreadable files are left to
    the renderers' own errors)."""
    dirty = []
    for path in sorted(Path(directory).rglob("*.json")):
        try:
            provenance = json.loads(path.read_text()).get("provenance") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            continue
        if isinstance(provenance, dict) and (provenance.get("git") or {}).get("dirty") is True:
            dirty.append(path)
    return dirty


def read_results(directory: str | Path, family: str | None = None) -> list[dict]:
    """Every result under ``directory`` (recursively, in path order), each checked as by
    :func:`read_result`; an empty list if the directory does not exist.

    Examples
    --------
    >>> len(read_results("results/tabular/fraction", "tabular"))  # doctest: +SKIP
    94
    """
    return [read_result(path, family) for path in sorted(Path(directory).rglob("*.json"))]
