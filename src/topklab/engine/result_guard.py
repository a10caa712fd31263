"""Where a run's portable result goes, so that a trial run never overwrites a committed one.

An experiment row says what its result is, never where it goes: its ``result`` block names the
family (vision, translation, language_modeling) and the report table, both set by the row's group,
and the row is the experiment's yaml stem unless the row names it. With ``result_file=auto`` (the
default) its file is :func:`result_path`'s ``<root>/results/<folder>/<table>/<row>/seed<k>.json``,
the folder being the family's or a study's (``routing``, ``sparsification``). A run writes there only
with the row's own settings: its command-line overrides may choose the row, the seed, the launcher,
machine paths and the logger, nothing that changes training. A run on another device type writes
beside the row, in the table ``<table>_<device>`` (so GPU rows get their own files and tables). A
stored result with another config or identity (:mod:`topklab.engine.run_identity`: the training source,
torch, the machine's numerics, the world size, the data) is refused in one line before training;
``check_result=true`` trains into the run's own folder and ends by comparing with it, and
``force_result=true`` replaces it, recording what it replaced. A field the stored result predates
compares under its default (:func:`stored_identity`, :data:`ADDED_FIELDS`). A ``result_file`` path
outside ``results/`` is the caller's own choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import torch

from topklab.data.fingerprint import DOCUMENTED_DATA
from topklab.engine.checkpoint import ENGINE_NOT_IN_KEY
from topklab.engine.run_identity import IDENTITY_FIELDS, UNRECORDED, identity_differences
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import NUMERICS_PACKAGES, cpu_isa, without_data_paths

ROW_OWN_KEYS = (
    "experiment",
    "seed",
    "recipe",
    "runner",
    "preset",
    "force_result",
    "check_result",
    "logger",
    "engine.progress",
    "engine.resume",
)  # overrides a row's result allows
ROW_OWN_PREFIXES = ("hydra", "paths.", "logger.", "runner.")
IGNORED_CONFIG_KEYS = (
    "logger",
    "force_result",
    "check_result",
    "runner",
    "preset",
    "check_dir",
)  # config keys that do not change a result
AUTO = "auto"  # result_file: the row's own file, from its result block (none for a run that is no row)
FAMILIES = ("vision", "translation", "language_modeling")  # families of a train.py run's result


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def changed_settings(overrides: list[str]) -> list[str]:
    """The command-line overrides that change a row's settings (anything but the row, seed,
    launcher, paths and logger).

    Examples
    --------
    >>> changed_settings(["experiment=fmnistlt/la_stk", "seed=2", "hydra/launcher=joblib", "engine.epochs=1"])
    ['engine.epochs=1']
    """
    return [o for o in overrides if _key(o) not in ROW_OWN_KEYS and not _key(o).startswith(ROW_OWN_PREFIXES)]


def chosen_experiment(overrides: list[str] | None) -> str | None:
    """The experiment row that command-line overrides choose: its path under ``configs/experiment/``.

    Examples
    --------
    >>> chosen_experiment(["seed=1", "experiment=stk/multi30k/atk", "hydra/launcher=joblib"])
    'stk/multi30k/atk'
    >>> chosen_experiment(["dataset=sinc"]) is None and chosen_experiment(None) is None
    True
    """
    chosen = [o.split("=", 1)[1] for o in overrides or [] if not o.startswith("~") and _key(o) == "experiment"]
    return chosen[-1] if chosen and chosen[-1] not in ("", "null") else None


def row_filing(result: Mapping | None, experiment: str | None) -> dict | None:
    """What an experiment row's result is: ``{family, folder, table, row}`` from the row's ``result``
    block, the row being the experiment's yaml stem unless the block names it (None: not known); None
    for a run that is no row (neither family nor table set).

    Examples
    --------
    >>> block = {"family": "language_modeling", "folder": "routing", "table": "multi30k_en", "row": None}
    >>> row_filing(block, "routing/dense")
    {'family': 'language_modeling', 'folder': 'routing', 'table': 'multi30k_en', 'row': 'dense'}
    >>> row_filing({"family": None, "folder": None, "table": None, "row": None}, None) is None
    True
    """
    if not result or (result.get("family") is None and result.get("table") is None):
        return None
    family, table = result.get("family"), result.get("table")
    if family not in FAMILIES or not table:
        raise TopklabError(
            f"result.family={family!r}, result.table={table!r}: an experiment row's group sets both "
            f"(family one of {', '.join(FAMILIES)}); set them, or remove the result block"
        )
    row = result.get("row") or (PurePosixPath(experiment).name if experiment else None)
    return {"family": family, "folder": result.get("folder") or family, "table": table, "row": row}


def result_path(root: str | Path, filing: dict, seed: int) -> Path:
    """An experiment row's result file: ``<root>/results/<folder>/<table>/<row>/seed<seed>.json``
    (``filing`` from :func:`row_filing`).

    Examples
    --------
    >>> result_path("/repo", {"folder": "vision", "table": "fmnistlt", "row": "la_stk"}, 2).as_posix()
    '/repo/results/vision/fmnistlt/la_stk/seed2.json'
    """
    if not filing["row"]:
        raise TopklabError(
            f"result_file=auto cannot name this {filing['table']} row (no experiment= among the overrides, no "
            f"result.row); pass experiment=<row> with the overrides, result.row=<name>, or result_file=<path> or null"
        )
    return Path(root) / "results" / filing["folder"] / filing["table"] / filing["row"] / f"seed{seed}.json"


def filed_as(filing: dict | None, asked: Path, task: str | None, device: torch.device) -> dict:
    """``{family, table, row}`` that the result's envelope and payload carry: the row's ``filing``
    (:func:`row_filing`). What it does not say, for a file asked for by path (a run that is no row, or
    a library call that names no experiment), comes from that file's folders ``<table>/<row>/`` and,
    for the family, the data's ``task`` (translation, language_modeling, else vision). A run on another
    device type than the CPU is filed in the table ``<table>_<device>``.

    Examples
    --------
    >>> filing = {"family": "translation", "folder": "translation", "table": "multi30k", "row": "stk"}
    >>> filed_as(filing, Path("/tmp/a/b/seed0.json"), "translation", torch.device("cuda"))
    {'family': 'translation', 'table': 'multi30k_cuda', 'row': 'stk'}
    >>> filed_as(None, Path("/tmp/mine/trial/seed0.json"), "binary", torch.device("cpu"))
    {'family': 'vision', 'table': 'mine', 'row': 'trial'}
    """
    filing = filing or {}
    family = filing.get("family") or (task if task in ("translation", "language_modeling") else "vision")
    table = filing.get("table") or asked.parent.parent.name
    suffix = "" if device.type == "cpu" else f"_{device.type}"
    return {"family": family, "table": f"{table}{suffix}", "row": filing.get("row") or asked.parent.name}


def agreed(values: list) -> object:
    """One value where ``values`` (a field in each training segment) agree, else a value no identity
    has: ``several (…)``, each as JSON.

    Examples
    --------
    >>> agreed([1, 1]), agreed([1, None])
    (1, 'several (1, null)')
    """
    texts = sorted({json.dumps(value, sort_keys=True) for value in values})
    return values[0] if len(texts) == 1 else f"several ({', '.join(texts)})"


def stored_identity(stored: dict) -> dict:
    """The identity (:func:`~topklab.engine.run_identity.identity`) of a stored result envelope: its
    training segments' (``summary.segments``), a field on which they disagree (a forced resume) being
    none of their values; completed from its provenance and summary where the segments predate a field
    (threads, CPU kernels and vector set, the numerics variables, the packages). The data of a result
    stored before its fingerprint was recorded compares as its dataset's documented files
    (:data:`~topklab.data.fingerprint.DOCUMENTED_DATA`)."""
    hardware = stored.get("provenance", {}).get("hardware", {})
    packages = stored.get("provenance", {}).get("packages")
    summary = stored.get("result", {}).get("summary", {})
    segments = summary.get("segments") or []
    recorded_once = stored.get("result", {}).get("identity") or {}  # a synthetic file's
    device = str(summary.get("device", "cpu")).split(":")[0]
    recorded = {
        "python": stored.get("provenance", {}).get("python"),
        "device": device,
        "threads": hardware.get("torch_threads"),
        "cpu_capability": hardware.get("torch_cpu_capability") if device == "cpu" else None,
        "cpu_isa": cpu_isa(hardware["cpu_flags"]) if hardware.get("cpu_flags") is not None else None,
        "data": summary.get("data_fingerprint") or DOCUMENTED_DATA.get(summary.get("dataset")),
        "environment": hardware.get("numerics_environment"),
        "packages": {name: packages.get(name, UNRECORDED) for name in NUMERICS_PACKAGES} if packages else None,
    }
    recorded = {k: v for k, v in recorded.items() if v is not None or k in ("cpu_capability", "data")}
    recorded.update(recorded_once)
    for field in IDENTITY_FIELDS:
        values = [segment[field] for segment in segments if field in segment]
        if values:
            recorded[field] = agreed([segment.get(field) for segment in segments])
    return recorded


def read_stored(path: Path, force: bool) -> dict | None:
    """The result envelope stored at ``path``; None where there is none. One that cannot be read is a
    one-line error, or under ``force`` (which replaces it) ``{"unreadable": why}``."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
        if not isinstance(stored, dict):
            raise ValueError(f"a JSON {type(stored).__name__}, not an object")
    except (OSError, ValueError) as err:
        if force:
            return {"unreadable": str(err)}
        raise TopklabError(f"{path} is not a readable result ({err}); move it away or pass force_result=true") from None
    return stored


def stored_differences(stored: dict, config: dict, mine: dict) -> list[str]:
    """What differs between a stored result envelope and this run (its ``config`` and identity
    ``mine``): identity fields (:func:`~topklab.engine.run_identity.identity_differences`), then config
    keys (the first three, and how many more)."""
    differences = identity_differences(stored_identity(stored), mine)
    old, new = (without_ignored(c) for c in (stored.get("config", {}), config))
    keys = differing_keys(old, new)
    return (
        differences
        + [f"config {key}" for key in keys[:3]]
        + ([f"{len(keys) - 3} more config keys"] if len(keys) > 3 else [])
    )


def without_ignored(config: dict) -> dict:
    """``config`` without what does not change a result: :data:`IGNORED_CONFIG_KEYS` and the engine's
    fields outside the run key (:data:`~topklab.engine.checkpoint.ENGINE_NOT_IN_KEY`: progress, resume,
    checkpointing).

    Examples
    --------
    >>> without_ignored({"logger": {"a": 1}, "engine": {"resume": False, "epochs": 2}})
    {'engine': {'epochs': 2}}
    """
    kept = without_data_paths({k: v for k, v in config.items() if k not in IGNORED_CONFIG_KEYS})
    if isinstance(kept.get("engine"), dict):
        kept["engine"] = {k: v for k, v in kept["engine"].items() if k not in ENGINE_NOT_IN_KEY}
    return kept


def refusal(path: Path, differences: list[str]) -> TopklabError:
    """The one-line refusal of a stored result (or cell) at ``path`` under other ``differences``."""
    hint = (
        " (threads: OMP_NUM_THREADS=<n> or runner.threads=<n>)"
        if any(d.startswith("threads ") for d in differences)
        else ""
    )
    return TopklabError(
        f"{path} holds a result with other settings ({'; '.join(differences)}); rerun with the stored "
        f"settings{hint}, or pass check_result=true to train into this run's folder and compare with it, or "
        f"force_result=true to replace it"
    )


def destination(
    result_file: str, root: str, overrides: list[str] | None, run_dir: str | Path, device: torch.device
) -> tuple[Path, str | None]:
    """``(path, note)``: where this run's result goes, and a one-line note when that is not ``result_file``.

    ``overrides`` None (a library call, not the command line) trusts ``result_file`` as given."""
    path = Path(result_file)
    results = Path(root).resolve() / "results"
    if results not in path.resolve().parents:
        return path, None
    changed = [] if overrides is None else changed_settings(overrides)
    if changed:
        beside = Path(run_dir) / "result.json"
        return beside, (
            f"result: {' '.join(changed)} changes the row's settings, so the result goes to {beside}, "
            f"not {path} (results/ holds each row's own settings)"
        )
    if device.type != "cpu":
        table = path.parent.parent
        beside = table.with_name(f"{table.name}_{device.type}") / path.parent.name / path.name
        return beside, f"result: a {device.type} run of this row goes to its own table, {beside}"
    return path, None


ADDED_FIELDS = {  # (class, field) added after results were stored: the value under which the code computes what it did before
    ("topklab.engine.Engine", "deterministic"): False,  # the kernels torch chose by default
    ("topklab.operators.SinkhornSort", "tol"): 0,  # every iteration ran
    ("topklab.operators.SinkhornSort", "unconverged"): "warn",  # a warning changes no number
}


def differing_keys(old, new, prefix: str = "") -> list[str]:
    """The dotted keys where a stored config ``old`` and this run's ``new`` differ. A field that
    ``old`` lacks and :data:`ADDED_FIELDS` lists for the class (``_target_``) it configures compares
    under that entry's value: the stored result ran before the field existed.

    Examples
    --------
    >>> differing_keys({"engine": {"_target_": "topklab.engine.Engine", "epochs": 2}},
    ...                {"engine": {"_target_": "topklab.engine.Engine", "epochs": 3, "deterministic": False}})
    ['engine.epochs']
    >>> differing_keys({"engine": {"_target_": "topklab.engine.Engine"}},
    ...                {"engine": {"_target_": "topklab.engine.Engine", "deterministic": True}})
    ['engine.deterministic']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        target = new.get("_target_")
        old = {**{k: v for (t, k), v in ADDED_FIELDS.items() if t == target and k in new}, **old}
        keys = sorted(set(old) | set(new))
        return [d for key in keys for d in differing_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    same = json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)  # as text: k=1 and k=1.0 differ
    return [] if same else [prefix.rstrip(".")]


TIMING_SUFFIXES = ("_s", "_seconds", "_mb")  # wall-clock times, rates and memory: measured, not computed
TIMING = ("data_wait_share", "loss_share", "seconds", "segments")  # time shares, a run's time; its identities


def timing(key) -> bool:
    """Whether a summary key holds a measurement of the machine (or the identities the run had) rather
    than a computed number.

    Examples
    --------
    >>> [timing(k) for k in ("elapsed_s", "images_per_s", "selection_s", "peak_memory_mb", "loss_share", "hard_share")]
    [True, True, True, True, True, False]
    """
    return isinstance(key, str) and (key.endswith(TIMING_SUFFIXES) or key in TIMING)


def _numbers(tree, prefix: str = "") -> dict[str, float]:
    """Every number in nested mappings and lists, by dotted key, measurements (:func:`timing`) left out."""
    if isinstance(tree, Mapping):
        items = [(key, value) for key, value in tree.items() if not timing(key)]
    elif isinstance(tree, list):
        items = list(enumerate(tree))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {prefix.rstrip("."): tree}
    else:
        return {}
    return {k: v for key, value in items for k, v in _numbers(value, f"{prefix}{key}.").items()}


def metric_differences(stored: Mapping, mine: Mapping) -> tuple[int, list[str]]:
    """``(compared, differences)`` between two summaries' numbers (every number but the machine's
    measurements, :func:`timing`: metrics, averaged checkpoints, history, λ and its tracking, steps):
    how many numbers both hold, and ``key stored → mine (±change)`` for each that is not equal
    bit for bit (or is in one only); NaN equals NaN.

    Examples
    --------
    >>> metric_differences({"metrics": {"test": {"acc": 0.5, "loss": 1.0}}}, {"metrics": {"test": {"acc": 0.5, "loss": 1.25}}})
    (2, ['metrics.test.loss 1.0 → 1.25 (+0.25)'])
    """
    old, new = (_numbers(summary) for summary in (stored, mine))

    def same(key) -> bool:
        a, b = old.get(key), new.get(key)
        return (key in old) == (key in new) and (a == b or (a != a and b != b))

    differences = [
        f"{key} {old.get(key, 'absent')} → {new.get(key, 'absent')}"
        + (f" ({new[key] - old[key]:+.4g})" if key in old and key in new else "")
        for key in sorted(set(old) | set(new))
        if not same(key)
    ]
    return len(set(old) & set(new)), differences


def compare_with_stored(path: Path, stored: dict, summary: dict) -> dict:
    """This run's ``summary`` against the result envelope ``stored`` (read from ``path`` before training):
    ``{path, compared, identical, differences, line}``, ``line`` saying in one line whether it reproduced
    the stored numbers bit for bit, or how they differ."""
    compared, differences = metric_differences(stored.get("result", {}).get("summary", {}), summary)
    line = (
        f"result: reproduces {path} bit for bit ({compared} numbers)"
        if not differences
        else f"result: differs from {path} in {len(differences)} of {compared} numbers: {'; '.join(differences[:4])}"
        + ("; …" if len(differences) > 4 else "")
    )
    return {
        "path": str(path), "compared": compared, "identical": not differences, "differences": differences,
        "line": line,
    }  # fmt: skip


def replaced_record(stored: dict) -> dict:
    """What a forced result replaces: the stored envelope's identity, metrics, command and commit (or why
    it could not be read)."""
    if "unreadable" in stored:
        return {"unreadable": stored["unreadable"]}
    return {
        "identity": stored_identity(stored),
        "metrics": stored.get("result", {}).get("summary", {}).get("metrics"),
        "command": stored.get("command"),
        "git": stored.get("provenance", {}).get("git"),
    }
