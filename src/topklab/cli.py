"""Command-line checks run before Hydra starts, so bad input fails fast with one line and
before any job of a sweep has written anything.

Overrides are read by Hydra's own parser, so every form Hydra accepts is checked the way Hydra will
read it: ``key=a,b``, ``range()``, ``glob()``, ``choice()``, ``interval()``, ``+key=``, ``~key``,
``group@pkg=``. Every value of every swept key is composed once before any job runs."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import topklab.launch  # noqa: F401  (Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.utils.errors import TopklabError
from topklab.utils.io import check_creatable

TRAIN_EXCLUDED = ("hydra", "local", "preset", "backbone")  # groups train.yaml does not select from
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
CHECKED_FLAGS = {"-m", "--multirun"}  # with any other flag (--help, --cfg, -cn ...) Hydra has the command line


def config_groups(config_dir: Path, exclude=TRAIN_EXCLUDED) -> dict[str, list[str]]:
    """Each config group under ``config_dir`` with its options; an option in a subfolder is named
    by its path (``stk/table3/australian``). Files starting with ``_`` are parts shared by the
    rows of a folder, not options."""
    return {
        group.name: sorted(p.relative_to(group).with_suffix("").as_posix() for p in group.rglob("*.yaml")
                           if not p.name.startswith("_"))
        for group in sorted(config_dir.iterdir())
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
        reason = "; ".join(line for line in str(err).splitlines()
                           if line.strip() != "^" and not line.startswith(("Error parsing", "See ")))
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
        raise TopklabError(f"{override.input_line}: glob() selects options of a config group; "
                           f"{override.key_or_group} is none of: {', '.join(groups)}")
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


def check_group_choices(overrides: list[str], config_dir: Path, exclude=TRAIN_EXCLUDED) -> None:
    """Every option an override chooses for a config group (each value of a sweep) exists."""
    groups = config_groups(config_dir, exclude)
    for override in parse_overrides(overrides):
        options = groups.get(override.key_or_group)
        if options is None or override.is_delete():
            continue
        for option in override_values(override, groups):
            if option not in options:
                raise TopklabError(
                    f"unknown {override.key_or_group} {option!r}; choose one of: {', '.join(options)}")


def sweep_points(overrides: list[Override], groups: dict[str, list[str]]) -> list[list[str]]:
    """One override list per value of every swept key (the others at their first value): each
    value is checked once without composing the whole grid."""
    choices = [[f"{o.get_key_element()}={v}" for v in override_values(o, groups)] or [o.input_line]
               for o in overrides]
    base = [values[0] for values in choices]
    return [base] + [base[:i] + [value] + base[i + 1:] for i, values in enumerate(choices) for value in values[1:]]


def check_configs(overrides: list[str], config_dir: Path, multirun: bool) -> None:
    """Compose the config for each sweep value and construct the cheap objects (loss, engine,
    dataset, model, logger ...) so that wrong types or ranges fail before any job runs."""
    from hydra import initialize_config_dir

    from topklab.engine.build import DATA_CONTEXT_KEYS, build, compose_run, data_context

    parsed = parse_overrides(overrides)
    sweeps = [o for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]
    if sweeps and not multirun:
        raise TopklabError(f"{sweeps[0].input_line} is a sweep; add -m to run one job per value")
    settings = [o.input_line for o in parsed if o.is_hydra_override() and not o.is_sweep_override()]
    task = [o for o in parsed if not o.is_hydra_override()]
    points = sweep_points(task, config_groups(config_dir))
    intervals = [o.input_line for o in task if o.is_interval_sweep()]
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="train"):  # train.py's job
        for i, point in enumerate(points):
            try:
                cfg = compose_run([*point, *settings], return_hydra_config=i == 0)
            except TopklabError as err:  # Hydra lists its whole search path after a missing config
                raise TopklabError(str(err).split(" Config search path:")[0]) from None
            if i == 0:
                hydra_cfg = cfg  # with Hydra's own node: the output folder and the sweeper
            for group in ("loss", "engine", "dataset", "logger", "individual", "model", "task", "tuner"):
                node = cfg.get(group)  # None: removed with ~group; data-dependent ones are checked once data is read
                if node is not None and not data_context(node, dict.fromkeys(DATA_CONTEXT_KEYS)):
                    build(node, group)
        check_output_dir(hydra_cfg, settings, multirun)
        sweeper = intervals and hydra_cfg.hydra.sweeper
        if sweeper and sweeper._target_ == BASIC_SWEEPER:
            raise TopklabError(f"{intervals[0]}: interval() needs a sweeper that samples (e.g. hydra/sweeper=optuna); "
                               "Hydra's basic sweeper takes a,b, range(), choice() and glob()")


def check_output_dir(cfg, settings: list[str], multirun: bool) -> None:
    """Hydra's run directory (a sweep's directory with ``-m``) can be created and written, so that a
    read-only, misplaced or full output folder is one line before Hydra tries (its mkdir would end in
    a traceback). A directory whose name Hydra only fixes later (``${hydra:job.num}``) is not checked."""
    from hydra.core.hydra_config import HydraConfig

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    hydra_config, previous = HydraConfig.instance(), HydraConfig.instance().cfg
    hydra_config.set_config(cfg)  # for ${hydra:job.name} and the like, as Hydra resolves them
    try:
        folder = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return
    finally:
        hydra_config.cfg = previous
    if folder is None:
        return
    setting = key if any(s.split("=", 1)[0].lstrip("+") == key for s in settings) else f"paths.log_dir or {key}"
    check_creatable(folder, f"the {'sweep' if multirun else 'run'} directory", setting)


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
        if override is not None and override.value_type == ValueType.GLOB_CHOICE_SWEEP and override.key_or_group in groups:
            arg = f"{override.get_key_element()}={','.join(override_values(override, groups))}"
        out.append(arg)
    return out


def preflight(argv: list[str], config_dir: Path) -> None:
    """Exit with a one-line error (code 2) when the command line asks for something invalid."""
    flags = {a for a in argv if a.startswith("-")}
    if flags - CHECKED_FLAGS:
        return  # --help, --cfg, --info, -cn ... are Hydra's own
    args = [a for a in argv if not a.startswith("-")]
    try:
        check_group_choices(args, config_dir)
        check_configs(args, config_dir, multirun=bool(flags))
    except TopklabError as err:
        fail(err)


def fail(err: Exception | str) -> None:
    """Print ``error: <err>`` on stderr and exit with code 2 (an interrupted run: 128 + the signal).
    Any other exception than a :class:`TopklabError` is a bug, not a fault: it is raised again with its
    traceback instead of being hidden behind one line."""
    if isinstance(err, BaseException) and not isinstance(err, TopklabError):
        raise err
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(getattr(err, "exit_code", 2))
