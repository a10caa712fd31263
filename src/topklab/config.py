"""The config layer: everything about reading ``configs/`` and a command line's overrides, below the
engine and the command line that both use it.

- the config groups and their options (:func:`config_groups`);
- overrides as Hydra's own parser reads them (:func:`parse_overrides`), the values each gives its key
  (:func:`override_values`) and one override list per swept value (:func:`sweep_points`);
- ``group=glob(...)`` matched against a group's options in its subfolders too, as the sweeper that
  ``configs/hydra/default.yaml`` chooses (``hydra_plugins.topklab_sweeper.RowSweeper``) matches it;
- one composition of a run, whose dataset chooses the recipe inside Hydra's own composition
  (:func:`compose_run`);
- the loss configs by name (:func:`aggregate_config`), whose ``_target_`` names each aggregate's class.

Overrides are read by Hydra's own parser, so every form Hydra accepts is read the way Hydra will
read it: ``key=a,b``, ``range()``, ``glob()``, ``choice()``, ``interval()``, ``+key=``, ``~key``,
``group@pkg=``."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from topklab.utils.errors import TopklabError

TRAIN_EXCLUDED = ("hydra", "local", "backbone")  # groups train.yaml does not select from
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def config_groups(config_dir: Path, exclude=TRAIN_EXCLUDED) -> dict[str, list[str]]:
    """Each config group under ``config_dir`` with its options; an option in a subfolder is named
    by its path (``stk/table3/australian``). Files starting with ``_`` are parts shared by the
    rows of a folder, not options."""
    return {
        group.name: sorted(
            p.relative_to(group).with_suffix("").as_posix() for p in group.rglob("*.yaml") if not p.name.startswith("_")
        )
        for group in sorted(Path(config_dir).iterdir())
        if group.is_dir() and group.name not in exclude
    }


def parse_overrides(args: list[str]) -> list[Override]:
    """The command line's overrides as Hydra reads them; one that Hydra cannot read is a one-line
    :class:`TopklabError`."""
    parser = OverridesParser.create()
    return [_parse(parser, arg) for arg in args]


def _parse(parser: OverridesParser, arg: str) -> Override:
    """One override, or a one-line error that names it."""
    try:
        return parser.parse_overrides([arg])[0]
    except OverrideParseException as err:
        reason = "; ".join(
            line
            for line in str(err).splitlines()
            if line.strip() != "^" and not line.startswith(("Error parsing", "See "))
        )
        raise TopklabError(f"cannot read the override {arg!r} ({reason}); write key=value, see {GRAMMAR}") from None


def _element(override: Override, groups: dict) -> list[str]:
    """``key=value``: the value, as written."""
    return [override.get_value_element_as_str()]


def _sweep(override: Override, groups: dict) -> list[str]:
    """``a,b``, ``choice()``, ``range()``, ``shuffle()``: every value, as Hydra's sweeper lists them."""
    return list(override.sweep_string_iterator())


def _glob(override: Override, groups: dict) -> list[str]:
    """``group=glob(...)``: the group's options it matches."""
    if override.key_or_group not in groups:
        raise TopklabError(
            f"{override.input_line}: glob() selects options of a config group; "
            f"{override.key_or_group} is none of: {', '.join(groups)}"
        )
    return override.value().filter(groups[override.key_or_group])


def _interval(override: Override, groups: dict) -> list[str]:
    """``interval(a,b)``: both ends (a sampling sweeper draws between them)."""
    return [str(override.value().start), str(override.value().end)]


VALUES = {  # how each kind of override value lists the values it gives its key
    ValueType.ELEMENT: _element,
    ValueType.SIMPLE_CHOICE_SWEEP: _sweep,
    ValueType.CHOICE_SWEEP: _sweep,
    ValueType.RANGE_SWEEP: _sweep,
    ValueType.GLOB_CHOICE_SWEEP: _glob,
    ValueType.INTERVAL_SWEEP: _interval,
}


def override_values(override: Override, groups: dict[str, list[str]]) -> list[str]:
    """The values an override gives its key: every value of a sweep (a ``glob()`` matched against the
    group's options), both ends of an ``interval()``, the one value otherwise, none for ``~key``."""
    if override.value_type is None:
        return []
    values = VALUES[override.value_type](override, groups)
    if not values:
        raise TopklabError(f"{override.input_line} gives no values; widen the sweep")
    return values


def sweep_points(overrides: list[Override], groups: dict[str, list[str]]) -> list[list[str]]:
    """One override list per value of every swept key (the others at their first value): each
    value is checked once without composing the whole grid."""
    choices = [[f"{o.get_key_element()}={v}" for v in override_values(o, groups)] or [o.input_line] for o in overrides]
    base = [values[0] for values in choices]
    return [base] + [base[:i] + [value] + base[i + 1 :] for i, values in enumerate(choices) for value in values[1:]]


def override_root(override: str) -> str:
    """The config group or top-level key an override sets: ``preset`` for ``preset.max_epochs=5``,
    ``hydra`` for ``hydra/launcher=joblib``, ``loss`` for ``+loss.k=3``.

    Examples
    --------
    >>> [override_root(o) for o in ["preset.n_splits=2", "hydra/launcher=joblib", "~logger", "seed=1"]]
    ['preset', 'hydra', 'logger', 'seed']
    """
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0].split("/", 1)[0].split("@", 1)[0]


def check_one_process_command(runner: str, overrides: list[str], allowed: tuple[str, ...], refusal: str) -> None:
    """For a runner that runs a whole protocol in one process (a tabular row's cells, a synthetic
    column): a one-line :class:`TopklabError` under torchrun, or for the first override whose
    :func:`override_root` is not ``allowed`` (``"{override} " + refusal``)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TopklabError(f"runner={runner} runs in one process; start it without torchrun")
    ignored = [o for o in overrides if override_root(o) not in allowed]
    if ignored:
        raise TopklabError(f"{ignored[0]} {refusal}")


def compose_run(overrides: list[str], config_name: str = "train", return_hydra_config: bool = False) -> DictConfig:
    """Compose ``config_name`` with ``overrides`` once, as ``python train.py`` does (Hydra must be
    initialised: inside a ``@hydra.main`` app or ``initialize_config_dir``). The recipe is chosen in
    that one composition: each dataset's yaml overrides ``recipe`` with its task's, and choices of
    model, optim, individual, engine, task or recipe on the command line win over it.
    ``return_hydra_config``: keep Hydra's own node (``hydra.run.dir`` ...) in the result. A config
    that cannot be composed, or whose dataset chooses no recipe, is a one-line :class:`TopklabError`."""
    try:
        cfg = compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise TopklabError(" ".join(str(err).split())) from None
    if cfg.get("recipe") == "auto":
        raise TopklabError(
            f"dataset {OmegaConf.select(cfg, 'dataset.name') or OmegaConf.select(cfg, 'dataset._target_')} chooses no "
            "recipe: add `defaults: [override /recipe@_group_: <task>]` to its yaml, or pass recipe=<name> (none: no recipe)"
        )
    return cfg


def loss_config_dir() -> Path:
    """``$TOPKLAB_ROOT/configs/loss``; without TOPKLAB_ROOT, the checkout this package lies in."""
    root = os.environ.get("TOPKLAB_ROOT") or Path(__file__).resolve().parents[2]
    return Path(root) / "configs" / "loss"


def aggregate_names() -> list[str]:
    """The loss-config names, sorted (``atk``, ``average``, …)."""
    return sorted(p.stem for p in loss_config_dir().glob("*.yaml"))


def aggregate_config(name: str) -> DictConfig:
    """The loss config ``configs/loss/<name>.yaml`` (unresolved)."""
    path = loss_config_dir() / f"{name}.yaml"
    if not path.is_file():
        raise TopklabError(f"unknown aggregate {name!r}; choose one of: {', '.join(aggregate_names())}")
    config = OmegaConf.load(path)
    config.pop("defaults", None)
    return config
