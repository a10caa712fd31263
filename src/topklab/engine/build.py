"""From a composed config to objects: ``instantiate`` with one-line errors, the data-dependent
constructor arguments a target asks for, and the recipe a dataset's task implies."""
from __future__ import annotations

import inspect
from pathlib import Path

from hydra import compose
from hydra.errors import HydraException, InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from topklab.utils.errors import TopklabError

DATA_CONTEXT_KEYS = ("in_features", "in_channels", "num_classes", "class_counts", "shot_counts", "target", "vocab_size",
                     "pad_id", "vocab", "class_names")


def build(node: DictConfig, group: str, **kwargs):
    """``instantiate`` that turns a constructor's ValueError/TypeError into a one-line
    :class:`TopklabError` naming the config group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, TopklabError):
            raise cause
        if isinstance(cause, (ValueError, TypeError)):
            raise TopklabError(f"{group}: {cause}") from None
        raise


def data_context(node: DictConfig, context: dict) -> dict:
    """The entries of ``context`` (what the data provides: in_features, num_classes, class_counts ...)
    that the node's ``_target_`` accepts and the config does not set itself."""
    try:
        parameters = inspect.signature(get_object(node._target_)).parameters
    except (ImportError, ValueError, TypeError, AttributeError):
        return {}
    return {k: v for k, v in context.items() if k in parameters and k not in node}


def build_for_data(node: DictConfig, group: str, context: dict):
    """:func:`build` with the data-dependent arguments the target asks for; a target that needs
    one the dataset cannot give (an MLP on images) gets a one-line error naming both."""
    try:
        return build(node, group, **data_context(node, context))
    except TopklabError as err:
        if "missing" in str(err) and "required" in str(err):
            raise TopklabError(f"{group} {node._target_.rsplit('.', 1)[-1]} does not fit this dataset "
                               f"(it provides {', '.join(context) or 'nothing'}): {err}") from None
        raise


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
    try:
        recipe = recipe_for(compose(config_name, overrides=[o for o in overrides if chooses_groups(o)]))
        if recipe is not None:
            overrides = [*(o for o in overrides if not o.lstrip("+~").startswith("recipe=")), f"recipe={recipe}"]
        cfg = compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise TopklabError(" ".join(str(err).split())) from None
    return cfg


def recipe_arguments(args: list[str], config_dir, multirun: bool) -> list[str]:
    """``["recipe=<task>"]`` for a command line that leaves ``recipe=auto``, so that Hydra composes
    train.py's config once with the right groups; every point of a ``-m`` sweep must agree."""
    from hydra import initialize_config_dir

    from topklab.cli import config_groups, parse_overrides, sweep_points

    overrides = [o for o in parse_overrides([a for a in args if "=" in a or a.startswith("~")])
                 if not o.is_hydra_override()]
    if any(o.key_or_group == "recipe" for o in overrides):
        return []
    points = sweep_points(overrides, config_groups(Path(config_dir))) if multirun else [[o.input_line for o in overrides]]
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        recipes = {recipe_for(compose("train", overrides=[o for o in point if chooses_groups(o)])) for point in points}
    if len(recipes) > 1:
        raise TopklabError(f"this sweep mixes datasets that need different recipes ({', '.join(sorted(map(str, recipes)))}); "
                           f"pass recipe=<name> or run one sweep per kind of dataset")
    recipe = recipes.pop()
    return [] if recipe is None else [f"recipe={recipe}"]
