"""Where a run's portable result goes, so that a trial run never overwrites a committed one.

An experiment row says what its result is, never where it goes: its ``result`` block names the
family (vision, translation, language_modeling) and the report table, both set by the row's group,
and the row is the experiment's yaml stem unless the row names it. With ``result_file=auto`` (the
default) its file is :func:`result_path`'s ``<root>/results/<folder>/<table>/<row>/seed<k>.json``,
the folder being the family's or a study's (``routing``, ``sparsification``). A run writes there only
with the row's own settings: its command-line overrides may choose the row, the seed, the launcher,
machine paths and the logger, nothing that changes training. A run on another device type writes
beside the row, in the table ``<table>_<device>`` (so GPU rows get their own files and tables). A
stored result with other settings (config, thread count, CPU kernels, kernel-choosing environment
variables, data files) is replaced only with ``force_result=true``, checked before training starts;
a field the stored result predates compares under its default (:func:`stored_identity`,
:data:`ADDED_FIELDS`). A ``result_file`` path outside ``results/``
is the caller's own choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import torch

from topklab.data.fingerprint import DOCUMENTED_DATA
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import numerics_environment

ROW_OWN_KEYS = (
    "experiment",
    "seed",
    "recipe",
    "runner",
    "preset",
    "force_result",
    "logger",
    "engine.progress",
    "engine.resume",
)  # overrides a row's result allows
ROW_OWN_PREFIXES = ("hydra", "paths.", "logger.", "runner.")
IGNORED_CONFIG_KEYS = ("logger", "force_result", "runner", "preset")  # config keys that do not change a result
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


def identity(device: torch.device, data: str | None) -> dict:
    """What besides the config shapes a result: device type, torch's thread count and CPU kernels, the
    environment variables that choose kernels or precision
    (:data:`~topklab.utils.provenance.NUMERICS_ENVIRONMENT`) and the fingerprint of the data files
    read (:mod:`topklab.data.fingerprint`; None for data that names no files)."""
    return {
        "device": device.type,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else None,
        "environment": numerics_environment(),
        "data": data,
    }


def stored_identity(stored: dict) -> dict:
    """:func:`identity` of a stored result envelope (from its summary and provenance). A result stored
    before a field was recorded compares under that field's default: it ran under none of the
    environment's variables, and on its dataset's documented files
    (:data:`~topklab.data.fingerprint.DOCUMENTED_DATA`; not compared for another dataset)."""
    hardware = stored.get("provenance", {}).get("hardware", {})
    summary = stored.get("result", {}).get("summary", {})
    device = str(summary.get("device", "cpu")).split(":")[0]
    return {
        "device": device,
        "threads": hardware.get("torch_threads"),
        "cpu_capability": hardware.get("torch_cpu_capability") if device == "cpu" else None,
        "environment": hardware.get("numerics_environment") or {},
        "data": summary.get("data_fingerprint") or DOCUMENTED_DATA.get(summary.get("dataset")),
    }


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


def check_replaceable(path: Path, config: dict, mine: dict, force: bool) -> None:
    """Raise a one-line error if ``path`` holds a result with other settings or identity (unless ``force``)."""
    if force or not path.is_file():
        return
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TopklabError(f"{path} is not a readable result ({err}); move it away or pass force_result=true") from None
    theirs = stored_identity(stored)
    differences = [
        f"{name} {theirs[name]} → {mine[name]}"
        for name in mine
        if theirs.get(name) is not None and theirs[name] != mine[name]
    ]
    old, new = (
        {k: v for k, v in c.items() if k not in IGNORED_CONFIG_KEYS} for c in (stored.get("config", {}), config)
    )
    differences += [f"config {key}" for key in differing_keys(old, new)][:3]
    if differences:
        raise TopklabError(
            f"{path} holds a result with other settings ({'; '.join(differences)}); rerun with the stored "
            f"settings, or pass force_result=true to replace it"
        )


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
    return [] if old == new else [prefix.rstrip(".")]
