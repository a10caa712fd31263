"""The hyperparameter grid of the STk paper's tabular experiments (papers.md §1.11)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from topklab.engine.aggregates import aggregate_class
from topklab.utils.errors import TopklabError
from topklab.utils.k import validate_k


@dataclass(frozen=True)
class Grid:
    """Values searched for each hyperparameter. An aggregate only spans the axes it uses (its
    class's ``hyperparameters``): Average and Maximum span C × η; ATk and MATk add k; STk adds δ.

    Parameters
    ----------
    k : ints (counts, >= 1) or floats in (0, 1] (fractions of the batch); paper: {1} ∪ {0.1, …, 1.0}
    C : floats > 0, regulariser 1/(2C)·‖w‖² (larger C = weaker); paper: {1, 10, …, 1e5}
    lr : floats > 0, AdaGrad η; paper: {0.1, 0.05, 0.01, 0.005, 0.001}
    delta : floats > 0, SReLU smoothing width δ (STk only); paper: {0.1, 0.01, 0.001, 0.0001}

    Examples
    --------
    >>> grid = Grid(k=[1, 0.5], C=[1.0, 10.0], lr=[0.1], delta=[0.1, 0.01])
    >>> len(grid.combos("average")), len(grid.combos("atk")), len(grid.combos("stk"))
    (2, 4, 8)
    """

    k: tuple
    C: tuple
    lr: tuple
    delta: tuple

    def __post_init__(self):
        for name in ("k", "C", "lr", "delta"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            if not values:
                raise TopklabError(f"grid.{name} is empty; give at least one value")
        for k in self.k:
            try:
                validate_k(k)
            except ValueError as err:
                raise TopklabError(f"grid.k: {err}") from None
        for name in ("C", "lr", "delta"):
            for value in getattr(self, name):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise TopklabError(f"grid.{name} contains {value!r}; every value must be a number > 0")

    def combos(self, aggregate: str) -> list[dict]:
        """Every combination the aggregate uses, in a fixed order (k, C, η, δ; last varies fastest).
        Axes the aggregate ignores are pinned (k = 1, δ = the first value) and not searched."""
        axes = aggregate_class(aggregate).hyperparameters
        ks = self.k if "k" in axes else (1,)
        deltas = self.delta if "delta" in axes else self.delta[:1]
        return [
            {"k": k, "C": c, "lr": lr, "delta": d} for k, c, lr, d in itertools.product(ks, self.C, self.lr, deltas)
        ]
