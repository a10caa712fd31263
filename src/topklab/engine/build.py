"""From a composed config to objects: ``instantiate`` with one-line errors and the data-dependent
constructor arguments a target asks for. (Composing the config, with the recipe a dataset's task
implies, is :mod:`topklab.config`'s.)"""

from __future__ import annotations

import inspect

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig

from topklab.utils.errors import TopklabError

DATA_CONTEXT_KEYS = (
    "in_features",
    "in_channels",
    "num_classes",
    "class_counts",
    "shot_counts",
    "target",
    "vocab_size",
    "pad_id",
    "vocab",
    "class_names",
)


def build(node: DictConfig, group: str, **kwargs):
    """``instantiate`` that turns a constructor's ValueError/TypeError into a one-line
    :class:`TopklabError` naming the config group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, TopklabError):
            raise cause from None
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
            raise TopklabError(
                f"{group} {node._target_.rsplit('.', 1)[-1]} does not fit this dataset "
                f"(it provides {', '.join(context) or 'nothing'}): {err}"
            ) from None
        raise
