"""Small models stacked along a leading member dimension, for the population executor.

Member m starts exactly where a single run starts: its parameters are those of the model module
built under ``torch.manual_seed(seed_m)``. Three forwards cover the executor's layouts; each is a
fixed sequence of batched matrix products, so a member's outputs do not depend on which or how
many other members share the call:

- ``gathered``: every member on its own inputs (P, B, d), one small GEMM per member;
- ``grouped``: G groups of M members on their group's inputs (G, B, d), without copying them;
- ``shared``: P members on one input (n, d), for evaluation on a whole split.
"""

from __future__ import annotations

import torch
from torch import nn

from topklab.models import MLP, Linear
from topklab.utils.checks import check_int


class StackedModel:
    """P copies of ``module()`` as ``{name: Tensor (P, ...)}``; ``weights`` are the matrices
    (penalised by l1), ``names`` all parameters in the module's order (penalised by l2)."""

    names: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()

    def __init__(self, in_features: int):
        check_int("in_features", in_features)
        self.in_features = in_features

    def module(self) -> nn.Module:
        """The single model a member equals (built under the caller's RNG state)."""
        raise NotImplementedError

    def init(self, seeds: list[int], dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Member m's parameters are ``module()``'s after ``torch.manual_seed(seeds[m])``;
        the global RNG is left as it was."""
        unique, member_seed = torch.unique(torch.as_tensor(seeds), return_inverse=True)
        built = []
        with torch.random.fork_rng():
            for seed in unique.tolist():
                torch.manual_seed(seed)
                built.append([p.detach() for p in self.module().parameters()])
        return {name: torch.stack([ps[i] for ps in built]).to(dtype)[member_seed] for i, name in enumerate(self.names)}

    def gathered(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """x (P, B, d), one batch per member -> outputs (P, B, 1)."""
        raise NotImplementedError

    def grouped(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """x (G, B, d) and parameters (G·M, ...), members grouped by G -> outputs (G·M, B, 1)."""
        raise NotImplementedError

    def shared(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """x (n, d), the same inputs for all P members -> outputs (P, n, 1)."""
        raise NotImplementedError


class StackedMLP(StackedModel):
    """The STk paper's 2-layer MLP (:class:`topklab.models.MLP`, one output), stacked.

    Examples
    --------
    >>> model = StackedMLP(3, hidden=4)
    >>> params = model.init([0, 1, 0], torch.float32)
    >>> _ = torch.manual_seed(1)
    >>> single, x = MLP(3, 4), torch.randn(5, 3)  # member 1 was built right after manual_seed(1)
    >>> torch.allclose(model.shared(params, x)[1], single(x))
    True
    """

    names = ("w1", "b1", "w2", "b2")
    weights = ("w1", "w2")

    def __init__(self, in_features: int, hidden: int = 10):
        super().__init__(in_features)
        check_int("hidden", hidden)
        self.hidden = hidden

    def module(self) -> nn.Module:
        return MLP(self.in_features, self.hidden)

    def gathered(self, params, x):
        h = torch.relu(torch.baddbmm(params["b1"][:, None, :], x, params["w1"].transpose(1, 2)))
        return torch.baddbmm(params["b2"][:, None, :], h, params["w2"].transpose(1, 2))

    def grouped(self, params, x):
        groups, batch, d = x.shape
        w1 = params["w1"].view(groups, -1, self.hidden, d)
        h = torch.relu(torch.einsum("gbd,gmhd->gmbh", x, w1) + params["b1"].view(groups, -1, 1, self.hidden))
        out = torch.einsum("gmbh,gmh->gmb", h, params["w2"].view(groups, -1, self.hidden))
        return (out + params["b2"].view(groups, -1, 1)).reshape(-1, batch, 1)

    def shared(self, params, x):
        n, d = x.shape
        members = params["b2"].shape[0]
        h = torch.addmm(params["b1"].reshape(-1), x, params["w1"].reshape(-1, d).t()).relu_()
        out = (h.view(n, members, self.hidden) * params["w2"][:, 0, :]).sum(-1).t()
        return (out + params["b2"]).unsqueeze(-1)


class StackedLinear(StackedModel):
    """The linear predictor ``f(x) = wᵀx + b`` (:class:`topklab.models.Linear`, i.e. ``nn.Linear(d, 1)``),
    stacked.

    Examples
    --------
    >>> model = StackedLinear(2)
    >>> params = {"w": torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]]), "b": torch.tensor([[0.5], [0.0]])}
    >>> model.grouped(params, torch.tensor([[[1.0, 1.0], [2.0, 3.0]]]))[..., 0]  # one group of two members
    tensor([[1.5000, 2.5000],
            [2.0000, 6.0000]])
    """

    names = ("w", "b")
    weights = ("w",)

    def module(self) -> nn.Module:
        return Linear(self.in_features)

    def gathered(self, params, x):
        return torch.baddbmm(params["b"][:, None, :], x, params["w"].transpose(1, 2))

    def grouped(self, params, x):
        groups, batch, d = x.shape
        out = torch.einsum("gbd,gmd->gmb", x, params["w"].view(groups, -1, d)) + params["b"].view(groups, -1, 1)
        return out.reshape(-1, batch, 1)

    def shared(self, params, x):
        return ((x @ params["w"][:, 0, :].t()).t() + params["b"]).unsqueeze(-1)
