"""Hydra's basic sweeper, with ``glob()`` that also matches a group's options in its subfolders.

Hydra lists a config group's top-level options only, so ``experiment=glob(petersen/cifar100/*)``
(rows live in ``configs/experiment/<paper>/<table>/``) would launch no job under the basic sweeper.
:class:`RowSweeper` is that sweeper with one change: the group listing it parses the command line
against names an option in a subfolder by its path (``stk/table3/australian``), leaving out files
whose name starts with ``_`` (the parts a folder's rows share), as ``topklab.config.config_groups``
does for the preflight checks. ``configs/hydra/default.yaml`` chooses it (``hydra/sweeper: rows``).

Hydra instantiates sweepers only from the ``hydra_plugins`` package, hence this module's place; it
imports nothing from topklab.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.object_type import ObjectType
from hydra.types import HydraContext


class NestedGroupOptions:
    """A config loader whose ``get_group_options`` lists a group's configs in its subfolders too;
    everything else is the wrapped loader's."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not yet set (while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def get_group_options(
        self,
        group_name: str,
        results_filter: ObjectType | None = ObjectType.CONFIG,
        config_name: str | None = None,
        overrides: list[str] | None = None,
    ) -> list[str]:
        def options(group: str, kind: ObjectType) -> list[str]:
            return self.loader.get_group_options(
                group, results_filter=kind, config_name=config_name, overrides=overrides
            )

        if results_filter != ObjectType.CONFIG:
            return options(group_name, results_filter)
        found = [name for name in options(group_name, ObjectType.CONFIG) if not name.startswith("_")]
        for folder in options(group_name, ObjectType.GROUP):
            found += [
                f"{folder}/{name}"
                for name in self.get_group_options(f"{group_name}/{folder}", ObjectType.CONFIG, config_name, overrides)
            ]
        return sorted(found)


class RowSweeper(BasicSweeper):
    """:class:`~hydra._internal.core_plugins.basic_sweeper.BasicSweeper` whose ``glob()`` reaches
    options in a group's subfolders (see the module's docstring); its launcher is set up as the
    basic sweeper's."""

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: Any) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.hydra_context = HydraContext(
            config_loader=NestedGroupOptions(hydra_context.config_loader), callbacks=hydra_context.callbacks
        )
