"""The config layer: everything about reading ``configs/`` and a command line's overrides, below the
engine and the command line that both use it.

- the config groups and their options (:func:`config_groups`);
- overrides as Hydra's own parser reads them (:func:`parse_overrides`), the values each gives its key
  (:func:`override_values`) and one override list per swept value (:func:`sweep_points`);
- ``group=glob(...)`` written out as the options it matches (:func:`expand_group_globs`);
- composition with the recipe a dataset's task implies (:func:`compose_run`, :func:`recipe_for`,
  :func:`recipe_arguments`).

Overrides are read by Hydra's own parser, so every form Hydra accepts is read the way Hydra will
read it: ``key=a,b``, ``range()``, ``glob()``, ``choice()``, ``interval()``, ``+key=``, ``~key``,
``group@pkg=``."""

from __future__ import annotations

from pathlib import Path

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from topklab.utils.errors import TopklabError

TRAIN_EXCLUDED = ("hydra", "local", "preset", "backbone")  # groups train.yaml does not select from
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


def expand_group_globs(argv: list[str], config_dir: Path) -> list[str]:
    """``group=glob(...)`` written out as the options it matches: Hydra's sweeper lists only a group's
    top-level options, so a glob over rows in subfolders (``experiment=glob(petersen/cifar100/*)``)
    would launch no job; other arguments are returned as they are.

    Examples
    --------
    >>> expand_group_globs(["-m", "experiment=glob(sinkhorn_beta/beta_1*)", "seed=0"], CONFIG_DIR)  # doctest: +SKIP
    ['-m', 'experiment=sinkhorn_beta/beta_1,sinkhorn_beta/beta_10,sinkhorn_beta/beta_100,sinkhorn_beta/beta_1000', 'seed=0']
    """
    groups = config_groups(config_dir)
    out = []
    for arg in argv:
        override = None if arg.startswith("-") or "glob(" not in arg else _parse(OverridesParser.create(), arg)
        if (
            override is not None
            and override.value_type == ValueType.GLOB_CHOICE_SWEEP
            and override.key_or_group in groups
        ):
            arg = f"{override.get_key_element()}={','.join(override_values(override, groups))}"
        out.append(arg)
    return out


def recipe_for(cfg: DictConfig) -> str | None:
    """The recipe ``recipe=auto`` stands for: the dataset's ``task`` (binary | regression |
    multiclass); None when the config already names one."""
    if cfg.get("recipe") != "auto":
        return None
    task = OmegaConf.select(cfg, "dataset.task")
    if task is None:
        raise TopklabError(f"dataset {cfg.dataset.get('_target_')} has no task field; pass recipe=<name>")
    return str(task)


def chooses_groups(override: str) -> bool:
    """Whether an override can change the dataset's task: a group choice (``dataset=``,
    ``experiment=``) or a dataset field; field overrides of other groups wait for the recipe."""
    key = override.lstrip("+~").split("=", 1)[0]
    return not key.startswith("hydra") and ("." not in key or key.startswith("dataset."))


def compose_run(overrides: list[str], config_name: str = "train", return_hydra_config: bool = False) -> DictConfig:
    """Compose ``config_name`` with ``overrides`` (Hydra must be initialised: inside a
    ``@hydra.main`` app or ``initialize_config_dir``), resolving ``recipe=auto`` from the dataset:
    a first composition with the group choices finds the dataset's task, the second adds
    ``recipe=<task>``, so field overrides of the recipe's groups (``optim.momentum=``) apply.
    Command-line choices of model, optim, individual, engine and task win over the recipe's.
    ``return_hydra_config``: keep Hydra's own node (``hydra.run.dir`` ...) in the result."""
    return compose_with_recipe(overrides, config_name, return_hydra_config)[0]


def compose_with_recipe(
    overrides: list[str], config_name: str = "train", return_hydra_config: bool = False
) -> tuple[DictConfig, str | None]:
    """:func:`compose_run`'s config and the recipe it chose for ``recipe=auto`` (None: the command
    line or the config names one)."""
    try:
        recipe = recipe_for(compose(config_name, overrides=[o for o in overrides if chooses_groups(o)]))
        if recipe is not None:
            overrides = [*(o for o in overrides if not o.lstrip("+~").startswith("recipe=")), f"recipe={recipe}"]
        cfg = compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise TopklabError(" ".join(str(err).split())) from None
    return cfg, recipe


def recipe_arguments(args: list[str], config_dir, multirun: bool) -> list[str]:
    """``["recipe=<task>"]`` for a command line that leaves ``recipe=auto``, so that Hydra composes
    train.py's config once with the right groups; every point of a ``-m`` sweep must agree."""
    from hydra import initialize_config_dir

    overrides = [
        o for o in parse_overrides([a for a in args if "=" in a or a.startswith("~")]) if not o.is_hydra_override()
    ]
    if any(o.key_or_group == "recipe" for o in overrides):
        return []
    points = (
        sweep_points(overrides, config_groups(Path(config_dir))) if multirun else [[o.input_line for o in overrides]]
    )
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        recipes = {recipe_for(compose("train", overrides=[o for o in point if chooses_groups(o)])) for point in points}
    return agreed_recipe(recipes)


def agreed_recipe(recipes: set[str | None]) -> list[str]:
    """``["recipe=<task>"]`` for the one recipe every point of a command line chose (``[]``: the
    command line or the config names it); points that need different recipes are a one-line error."""
    if len(recipes) > 1:
        raise TopklabError(
            f"this sweep mixes datasets that need different recipes ({', '.join(sorted(map(str, recipes)))}); "
            f"pass recipe=<name> or run one sweep per kind of dataset"
        )
    [recipe] = recipes
    return [] if recipe is None else [f"recipe={recipe}"]
