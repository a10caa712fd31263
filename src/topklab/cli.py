"""Command-line checks run before Hydra starts, so bad input fails fast with one line and
before any job of a sweep has written anything.

Overrides are read by Hydra's own parser (:mod:`topklab.config`), so every form Hydra accepts is
checked the way Hydra will read it: ``key=a,b``, ``range()``, ``glob()``, ``choice()``,
``interval()``, ``+key=``, ``~key``, ``group@pkg=``. Every value of every swept key is composed once
before any job runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import topklab.launch  # noqa: F401  (the topklab.rank_* resolvers that Hydra's run directory reads)
from topklab.config import TRAIN_EXCLUDED, compose_run, config_groups, override_values, parse_overrides, sweep_points
from topklab.utils.errors import TopklabError, fail
from topklab.utils.io import check_creatable

BASIC_SWEEPERS = ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "hydra_plugins.topklab_sweeper.RowSweeper")
CHECKED_FLAGS = {"-m", "--multirun"}  # with any other flag (--help, --cfg, -cn ...) Hydra has the command line


def check_group_choices(overrides: list[str], config_dir: Path, exclude=TRAIN_EXCLUDED) -> None:
    """Every option an override chooses for a config group (each value of a sweep) exists."""
    groups = config_groups(config_dir, exclude)
    for override in parse_overrides(overrides):
        options = groups.get(override.key_or_group)
        if options is None or override.is_delete():
            continue
        for option in override_values(override, groups):
            if option not in options:
                raise TopklabError(f"unknown {override.key_or_group} {option!r}; choose one of: {', '.join(options)}")


def check_configs(overrides: list[str], config_dir: Path, multirun: bool) -> None:
    """Compose the config for each sweep value and construct the cheap objects (loss, engine,
    dataset, model, logger ...) so that wrong types or ranges fail before any job runs."""
    from hydra import initialize_config_dir

    from topklab.engine.build import DATA_CONTEXT_KEYS, build, data_context  # torch: only when configs are checked
    from topklab.engine.result_guard import chosen_experiment

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
            build(cfg.runner, "runner").check(cfg, [*point, *settings], chosen_experiment(point))
        check_output_dir(hydra_cfg, settings, multirun)
        sweeper = intervals and hydra_cfg.hydra.sweeper
        if sweeper and sweeper._target_ in BASIC_SWEEPERS:
            raise TopklabError(
                f"{intervals[0]}: interval() needs a sweeper that samples (e.g. hydra/sweeper=optuna); "
                "Hydra's basic sweeper takes a,b, range(), choice() and glob()"
            )


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


def preflight(argv: list[str], config_dir: Path) -> None:
    """Exit with a one-line error (code 2) when the command line asks for something invalid: one
    composition per sweep value (one for a single run), before Hydra composes the run itself."""
    flags = {a for a in argv if a.startswith("-")}
    if flags - CHECKED_FLAGS:
        return  # --help, --cfg, --info, -cn ... are Hydra's own
    args = [a for a in argv if not a.startswith("-")]
    try:
        check_group_choices(args, config_dir)
        check_configs(args, config_dir, multirun=bool(flags))
    except TopklabError as err:
        fail(err)
