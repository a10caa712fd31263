"""Differentiable sorting and selection networks (DiffSortNets) that propagate only the k columns
of the top-k permutation and mix wires pairwise: O(L·n·k) per row instead of difftopk's O(L·n²·k)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from topklab.operators.base import TopKOperator, positive
from topklab.operators.networks import NETWORKS, LayerPlan, plan
from topklab.operators.relaxations import RELAXATIONS, check_distribution


class Workspace:
    """Buffers for one (network, n, k, batch, dtype, device) and their per-layer views, built once
    (in eager mode; afresh in every traced forward and backward under ``torch.compile``), so that
    the loops of :class:`NetworkTopK` only launch arithmetic. Values are wire-major (n, batch),
    columns (n, k, batch); strided layers get views of both wires, gathered layers none. What a
    backward needs is copied out of the buffers, so calls may interleave."""

    def __init__(self, plans: list[LayerPlan], n: int, k: int, batch: int, dtype, device):
        self.plans = plans
        depth, widest = len(plans), max([0, *(layer.size for layer in plans)])
        new = dict(dtype=dtype, device=device)
        self.values, self.grad_values = torch.empty(n, batch, **new), torch.empty(n, batch, **new)
        self.columns, self.grad = torch.empty(n, k, batch, **new), torch.empty(n, k, batch, **new)
        self.signed, self.weights = torch.zeros(depth, widest, batch, **new), torch.zeros(depth, widest, batch, **new)
        self.grad_weights = torch.zeros(depth, widest, batch, **new)
        self.keep, self.through = torch.zeros_like(self.signed), torch.zeros_like(self.signed)
        self.sides = torch.ones(depth, widest, 1, **new)
        for depth_index, layer in enumerate(plans):
            self.sides[depth_index, : layer.size] = layer.side

        def strided(state, first=lambda layer: 0):
            return [layer.pairs(state, first(layer)) if layer.strided else None for layer in plans]

        def per_layer(buffer, first=lambda layer: 0, inner=0):
            return [layer.shaped(buffer[i, first(layer) : layer.size], inner) for i, layer in enumerate(plans)]

        window = lambda layer: layer.first  # noqa: E731
        self.value_pairs, self.grad_value_pairs = strided(self.values), strided(self.grad_values)
        self.column_pairs, self.grad_pairs = strided(self.columns, window), strided(self.grad, window)
        self.signed_at, self.weight_at = per_layer(self.signed), per_layer(self.weights)
        self.column_weight_at = per_layer(self.weights, window, inner=1)
        self.grad_weight_at = per_layer(self.grad_weights, window)
        self.keep_at, self.through_at = per_layer(self.keep), per_layer(self.through)
        self.side_at = per_layer(self.sides)
        self.ranks = torch.arange(k, device=device)


class NetworkTopK(torch.autograd.Function):
    """The top-k columns of a soft sorting network's permutation, with a hand-written backward.

    A comparator with side σ computes v = σ·(lower − upper) and w = F(v), then moves
    w·(lower − upper) from the lower wire to the upper one; the columns go back through the
    layers with the same weights (Petersen et al. 2021, Eq. 2–3). The forward keeps v, w and the
    column gaps of each layer's window; the backward runs the column recursion forwards, then the
    value recursion backwards. ``workspace`` is a callable that gives the :class:`Workspace`, which
    forward and backward each ask for: the cached one in eager mode, a new one (tensors of the
    traced graph, never a mutated input) under ``torch.compile``.
    """

    @staticmethod
    def forward(ctx, scores, workspace, relaxation, steepness, art_lambda):
        ws = workspace()
        x = ws.values
        x.copy_(scores.t())
        for layer, pair, v, w, side in zip(ws.plans, ws.value_pairs, ws.signed_at, ws.weight_at, ws.side_at):
            lower, upper = pair or layer.pairs(x)
            torch.sub(lower, upper, out=v)
            gap = v if layer.ascending else v.clone()
            if not layer.ascending:
                v.mul_(side)
            relaxation.weight(v, steepness, art_lambda, w)
            layer.mix(x, lower, upper, w, gap)
        columns = ws.columns
        n = columns.shape[0]
        columns.zero_()
        columns[n - 1 - ws.ranks, ws.ranks] = 1.0
        gaps = [None] * len(ws.plans)
        for depth in range(len(ws.plans) - 1, -1, -1):
            layer = ws.plans[depth]
            lower, upper = ws.column_pairs[depth] or layer.pairs(columns, layer.first)
            gaps[depth] = lower - upper
            layer.mix(columns, lower, upper, ws.column_weight_at[depth], gaps[depth], layer.first)
        ctx.save_for_backward(ws.signed.clone(), ws.weights.clone(), *gaps)
        ctx.workspace, ctx.relaxation, ctx.steepness, ctx.art_lambda = workspace, relaxation, steepness, art_lambda
        return columns.permute(2, 0, 1).clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad_output):
        ws = ctx.workspace()
        signed, weights, *gaps = ctx.saved_tensors
        ws.weights.copy_(weights)
        grad = ws.grad
        grad.copy_(grad_output.permute(1, 2, 0))
        for depth, layer in enumerate(ws.plans):
            lower, upper = ws.grad_pairs[depth] or layer.pairs(grad, layer.first)
            grad_gap = lower - upper
            torch.sum(grad_gap * gaps[depth], dim=-2, out=ws.grad_weight_at[depth])
            layer.mix(grad, lower, upper, ws.column_weight_at[depth], grad_gap, layer.first)
        slopes = ctx.relaxation.slope(signed, weights, ctx.steepness, ctx.art_lambda)
        # With v = σ·(lower − upper) and w = F(v), the value gradients of a comparator change by
        # t on the lower wire and −t on the upper one, t = (g_up − g_low)·(w + v·F') − σ·F'·∂L/∂w
        # (∂L/∂w from the columns, which sum (g_low − g_up)·gap: hence the minus).
        torch.addcmul(weights, signed, slopes, out=ws.keep)
        torch.mul(ws.grad_weights, slopes, out=ws.through).mul_(ws.sides).neg_()
        grad_x = ws.grad_values
        grad_x.zero_()
        for depth in range(len(ws.plans) - 1, -1, -1):
            layer = ws.plans[depth]
            lower, upper = ws.grad_value_pairs[depth] or layer.pairs(grad_x)
            carried = torch.addcmul(ws.through_at[depth], upper - lower, ws.keep_at[depth])
            layer.shift(grad_x, lower, upper, carried)
        return grad_x.t().clone(memory_format=torch.contiguous_format), None, None, None, None


class DiffSortNet(TopKOperator):
    """Relaxed top-k permutation from a sorting (or selection) network of soft comparators.

    Each comparator of the network mixes its two wires: the wire that receives the minimum keeps
    ``lerp(x_i, x_j, F(β·(x_i − x_j)))``, the other ``lerp(x_j, x_i, F(β·(x_i − x_j)))`` (Petersen
    et al. 2021, Eq. 2), with F a sigmoid (``distribution``). The top-k permutation is the
    transposed product of the layers' mixing matrices applied to the k output wires of the k
    largest values; each layer only mixes pairs, so it costs O(n·k), and backpropagation runs
    through these pairwise mixes. Same layouts, relaxations and output as difftopk's
    ``DiffTopkNet`` (columns reordered to this package's convention: column 0 = top-1).

    Parameters
    ----------
    network : "odd_even" | "bitonic" | "splitter_selection"
        Odd-even transposition (n layers), bitonic (about log2(n)²/2 layers) or Borgelt's splitter
        selection network (fewest comparators when k ≪ n).
    steepness : float > 0
        β, the inverse temperature of the soft swap; larger is sharper (β → ∞ is a hard sort).
        Petersen et al. use 0.5 on CIFAR-100 (logistic_phi) and 1 on ImageNet embeddings.
    distribution : "logistic" | "logistic_phi" | "gaussian" | "reciprocal" | "cauchy" | "optimal"
        The sigmoid F of the soft swap (difftopk's default is cauchy).
    art_lambda : float >= 0
        λ of the activation replacement trick, only for logistic_phi: F = σ(β·v / |v|^λ).

    Notes
    -----
    Extreme inputs (the rule of :mod:`topklab.operators.base`): the m₊ entries at +inf take ranks
    1..m₊ (sharing them where several), a −inf entry gets 0, and the finite entries get the network
    of their own size n_f (the finite entries in their order, k − m₊ output columns) in the ranks
    after m₊; with fewer than k entries above −inf the −inf ones share the last ranks. This is not
    the limit of the n-wire network (whose comparators would still mix the finite values in the
    n-wire layout): a network is defined by its number of wires, and the rule keeps the answer that
    of the same operator on the finite scores. Rows with an infinite score are grouped by (n_f, k')
    and each group runs its own network; a call checks that the scores are all finite first (one
    synchronisation on a GPU). Under ``torch.compile``, which cannot regroup rows without reading
    the data on the host, such rows give NaN instead (see
    :class:`~topklab.operators.base.TopKOperator`); finite rows get the eager values, and a model
    around the operator compiles as one graph (``fullgraph=True``). A NaN score makes its row NaN;
    an empty batch gives an empty result; float16 and bfloat16 are computed in float32 and returned
    in their dtype. Finite scores up to the dtype's maximum give finite P: where a difference of
    scores could overflow (a score beyond a quarter of the maximum), the values are halved and β
    rescaled to give the same comparators.

    Examples
    --------
    >>> net = DiffSortNet("odd_even", steepness=100.0, distribution="logistic")
    >>> net.permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])
    >>> net.permutation(torch.tensor([[0.1, float("inf"), -float("inf"), 1.0]]), 2).round()   # 2 finite wires
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])
    >>> net.soft_topk(torch.zeros(0, 4), 2).shape, net.soft_topk(torch.tensor([[0.1, float("nan")]]), 1)
    (torch.Size([0, 4]), tensor([[nan, nan]]))

    References
    ----------
    Petersen, Borgelt, Kuehne & Deussen, "Differentiable Sorting Networks for Scalable Sorting and
    Ranking Supervision", ICML 2021; "Monotonic Differentiable Sorting Networks", ICLR 2022;
    Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022 (splitter selection).
    """

    gives_permutation = True
    sums_to_k = True
    masks_extremes = False  # the layout depends on n: rows with infinite scores run per group

    def __init__(
        self, network: str = "odd_even", steepness: float = 10.0, distribution: str = "cauchy", art_lambda: float = 0.25
    ):
        super().__init__()
        if network not in NETWORKS:
            raise ValueError(f"network={network!r} is unknown; choose one of {', '.join(NETWORKS)}")
        self.network = network
        self.steepness = positive(steepness, "steepness", "larger is sharper")
        self.distribution = check_distribution(distribution)
        if isinstance(art_lambda, bool) or not isinstance(art_lambda, (int, float)) or art_lambda < 0:
            raise ValueError(f"art_lambda={art_lambda!r} must be a number >= 0")
        self.art_lambda = float(art_lambda)
        self._workspaces: dict[tuple, Workspace] = {}

    def extra_repr(self) -> str:
        return f"{self.network}, steepness={self.steepness}, distribution={self.distribution}"

    def workspace(
        self, n: int, k: int, batch: int, device: torch.device, dtype: torch.dtype
    ) -> Callable[[], Workspace]:
        """A callable that gives the network's layer plans and buffers for n wires, k outputs and a
        batch: the cached :class:`Workspace` in eager mode; while ``torch.compile`` traces, a new one
        at each call (forward and backward each build their buffers in their own graph) on plans
        built once."""
        key, compiling = (n, k, batch, str(device), dtype), torch.compiler.is_compiling()
        if compiling or key not in self._workspaces:
            plans = [layer.to(device, dtype) for layer in plan(NETWORKS[self.network](n, k), n, k)]
            if compiling:
                return lambda: Workspace(plans, n, k, batch, dtype, device)
            self._workspaces[key] = Workspace(plans, n, k, batch, dtype, device)
        workspace = self._workspaces[key]
        return lambda: workspace

    def _permutation(self, scores: torch.Tensor, k: int, rest=None) -> torch.Tensor:
        low_precision = scores.dtype in (torch.float16, torch.bfloat16)
        values = scores.float() if low_precision else scores
        # A comparator takes x_i − x_j, which overflows once scores reach a quarter of the dtype's
        # maximum: there the values are halved and β rescaled so that every comparator weighs the same
        # (F depends on β·v; logistic_phi's σ(β·v/(|v| + 1e-10)^λ) on β·2^(1−λ)·(v/2), up to its 1e-10).
        # No synchronisation: the choice is a tensor, and β a 0-d tensor in the comparators.
        halve = values.detach().abs().amax() > torch.finfo(values.dtype).max / 4
        factor = 2.0 ** (1.0 - self.art_lambda) if self.distribution == "logistic_phi" else 2.0
        steepness = torch.where(halve, self.steepness * factor, self.steepness).to(values.dtype)
        values = torch.where(halve, values / 2, values)
        workspace = self.workspace(scores.shape[1], k, scores.shape[0], scores.device, values.dtype)
        columns = NetworkTopK.apply(values, workspace, RELAXATIONS[self.distribution], steepness, self.art_lambda)
        return columns.to(scores.dtype)
