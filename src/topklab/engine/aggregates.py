"""Aggregates by their loss-config name: ``configs/loss/<name>.yaml`` names the class in ``_target_``
(:func:`topklab.config.aggregate_config` reads it), so a new aggregate is one class and one yaml,
and every consumer (the grid, the population executor, the tables) finds it by that name. It
instantiates with Hydra, so it lives with the engine: ``import topklab.losses`` imports neither."""

from __future__ import annotations

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from topklab.config import aggregate_config, aggregate_names
from topklab.losses.aggregate.base import Aggregate
from topklab.losses.aggregate.lambda_rules import PAPER
from topklab.utils.errors import TopklabError


def aggregate_class(name: str) -> type[Aggregate]:
    """The :class:`Aggregate` subclass that loss config ``name`` instantiates.

    Examples
    --------
    >>> aggregate_class("stk").hyperparameters, aggregate_class("average").has_threshold
    (('k', 'delta'), False)
    """
    cls = get_class(aggregate_config(name)._target_)
    if not (isinstance(cls, type) and issubclass(cls, Aggregate)):
        raise TopklabError(
            f"loss config {name!r} targets {cls!r}, which is not an Aggregate; "
            f"choose one of: {', '.join(aggregate_names())}"
        )
    return cls


def build_aggregate(name: str, **overrides) -> Aggregate:
    """Instantiate loss config ``name`` with ``overrides`` of its fields.

    Examples
    --------
    >>> build_aggregate("stk", smoothing="elu", lam_update="gradient", lam_init=0.0)
    STk(k=0.9, smoothing='elu', delta=0.01, lam_constraint='none', scale='paper', kernel='auto',
        lam_update='gradient', lam_lr=None, lam_init=0.0)
    """
    return instantiate(aggregate_node(name, **overrides))


def aggregate_node(name: str, **overrides) -> DictConfig:
    """Loss config ``name`` merged with ``overrides`` of its fields (an unknown field is an error)."""
    config = aggregate_config(name)
    unknown = sorted(set(overrides) - set(config) - {"_target_"})
    if unknown:
        raise TopklabError(
            f"aggregate {name!r} has no field(s) {', '.join(unknown)}; its fields: "
            f"{', '.join(k for k in config if k != '_target_') or 'none'}"
        )
    aggregate_class(name)
    return OmegaConf.merge(config, overrides)


def with_lam_update(config: DictConfig, lam_update: str | None = None) -> DictConfig:
    """A copy of loss config ``config`` whose threshold λ (if it has one) follows the rule
    ``lam_update`` (None: the paper's SGD-STk), with λ at the members' own learning rate
    (``lam_lr=null``): what the population executor (the tabular and synthetic tables) runs."""
    config = config.copy()
    if "lam_update" in config:
        config.lam_update, config.lam_lr = PAPER if lam_update is None else lam_update, None
    return config


def build_paper_update_aggregate(name: str, **overrides) -> Aggregate:
    """:func:`build_aggregate` with the paper's update (:func:`with_lam_update`), replacing the loss
    config's own.

    Examples
    --------
    >>> build_paper_update_aggregate("stk").lam_update, build_paper_update_aggregate("average").has_threshold
    ('gradient', False)
    """
    return instantiate(with_lam_update(aggregate_node(name, **overrides)))
