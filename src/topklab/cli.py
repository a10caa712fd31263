"""Command-line checks run before Hydra starts, so bad input fails fast with one line and
before any job of a sweep has written anything."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from topklab.utils.errors import TopklabError

GROUP_OVERRIDE = re.compile(r"^[+~]?([A-Za-z_][\w]*)=(.*)$")


TRAIN_EXCLUDED = ("hydra", "local", "preset")  # groups train.yaml does not select from


def config_groups(config_dir: Path, exclude=TRAIN_EXCLUDED) -> dict[str, list[str]]:
    return {
        group.name: sorted(p.stem for p in group.glob("*.yaml"))
        for group in sorted(config_dir.iterdir())
        if group.is_dir() and group.name not in exclude
    }


def sweep_values(value: str) -> list[str]:
    """The options of a plain comma sweep (``a,b``); Hydra's function syntax is left to Hydra."""
    if any(c in value for c in "()[]{}"):
        return [value]
    return [v.strip() for v in value.split(",")]


def check_group_choices(overrides: list[str], config_dir: Path, exclude=TRAIN_EXCLUDED) -> None:
    groups = config_groups(config_dir, exclude)
    for override in overrides:
        match = GROUP_OVERRIDE.match(override)
        if not match or match.group(1) not in groups:
            continue
        group, value = match.groups()
        for option in sweep_values(value):
            if option not in groups[group]:
                raise TopklabError(
                    f"unknown {group} {option!r}; choose one of: {', '.join(groups[group])}"
                )


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """One override list per value of every swept key (others at their first value): each value
    is checked once without composing the whole grid."""
    plain = [o for o in overrides if not o.startswith("hydra")]
    split = [(o.split("=", 1)[0], sweep_values(o.split("=", 1)[1])) if "=" in o else (o, None) for o in plain]
    base = [f"{k}={vals[0]}" if vals else k for k, vals in split]
    points = [base]
    for i, (key, vals) in enumerate(split):
        for value in (vals or [])[1:]:
            points.append(base[:i] + [f"{key}={value}"] + base[i + 1 :])
    return points


def check_configs(overrides: list[str], config_dir: Path, multirun: bool) -> None:
    """Compose the config for each sweep value and construct the cheap objects (loss, trainer,
    dataset, model, logger) so that wrong types or ranges fail before any job runs."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from topklab.train.run import DATA_CONTEXT_KEYS, build, data_context

    points = sweep_points(overrides) if multirun else [[o for o in overrides if not o.startswith("hydra")]]
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        for point in points:
            try:
                cfg = compose("train", overrides=point)
            except (HydraException, OmegaConfBaseException) as err:
                raise TopklabError(" ".join(str(err).split())) from None
            for group in ("loss", "trainer", "dataset", "logger", "individual", "model"):
                if not data_context(cfg[group], dict.fromkeys(DATA_CONTEXT_KEYS)):  # the rest is checked once data is read
                    build(cfg[group], group)


def preflight(argv: list[str], config_dir: Path) -> None:
    """Exit with a one-line error (code 2) when the command line asks for something invalid."""
    args = [a for a in argv if not a.startswith("-")]
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if any(a.startswith("--") and a not in ("--multirun",) for a in argv) or "-h" in argv:
        return  # --help, --cfg, --info ... are Hydra's own
    try:
        check_group_choices(args, config_dir)
        check_configs(args, config_dir, multirun)
    except TopklabError as err:
        fail(err)


def fail(err: Exception) -> None:
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(2)
