"""Where a run's portable result may go, so that a trial run never overwrites a committed one.

A row's result file lies under ``<root>/results/``. A run writes there only with the row's own
settings: its command-line overrides may choose the row, the seed, the launcher, machine paths and
the logger, nothing that changes training. A run on another device type writes beside the row, in
the table ``<table>_<device>`` (so GPU rows get their own files and tables). A stored result with
other settings (config, thread count, CPU kernels) is replaced only with ``force_result=true``,
checked before training starts. A result file outside ``results/`` is the caller's own choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from topklab.utils.errors import TopklabError

ROW_OWN_KEYS = (
    "experiment",
    "seed",
    "recipe",
    "force_result",
    "logger",
    "engine.progress",
    "engine.resume",
)  # overrides a row's result allows
ROW_OWN_PREFIXES = ("hydra", "paths.", "logger.")
IGNORED_CONFIG_KEYS = ("logger", "force_result")  # config keys that do not change a result


def changed_settings(overrides: list[str]) -> list[str]:
    """The command-line overrides that change a row's settings (anything but the row, seed,
    launcher, paths and logger).

    Examples
    --------
    >>> changed_settings(["experiment=fmnistlt/la_stk", "seed=2", "hydra/launcher=joblib", "engine.epochs=1"])
    ['engine.epochs=1']
    """

    def key(override: str) -> str:
        return override.lstrip("+~").split("=", 1)[0]

    return [o for o in overrides if key(o) not in ROW_OWN_KEYS and not key(o).startswith(ROW_OWN_PREFIXES)]


def identity(device: torch.device) -> dict:
    """What besides the config shapes a result: device type, torch's thread count and CPU kernels."""
    return {
        "device": device.type,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else None,
    }


def stored_identity(stored: dict) -> dict:
    """:func:`identity` of a stored result envelope (from its summary and provenance)."""
    hardware = stored.get("provenance", {}).get("hardware", {})
    device = str(stored.get("result", {}).get("summary", {}).get("device", "cpu")).split(":")[0]
    return {
        "device": device,
        "threads": hardware.get("torch_threads"),
        "cpu_capability": hardware.get("torch_cpu_capability") if device == "cpu" else None,
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
    differences += [f"config {key}" for key in _differing_keys(old, new)][:3]
    if differences:
        raise TopklabError(
            f"{path} holds a result with other settings ({'; '.join(differences)}); rerun with the stored "
            f"settings, or pass force_result=true to replace it"
        )


def _differing_keys(old, new, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [d for key in keys for d in _differing_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]
