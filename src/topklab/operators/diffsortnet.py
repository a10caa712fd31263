"""Differentiable sorting and selection networks (DiffSortNets) that propagate only the k columns
of the top-k permutation and mix wires pairwise: O(L·n·k) per row instead of difftopk's O(L·n²·k)."""
from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, check_scores, positive
from topklab.operators.networks import NETWORKS, LayerPlan, plan
from topklab.operators.relaxations import RELAXATIONS, check_distribution


class NetworkTopK(torch.autograd.Function):
    """The top-k columns of a soft sorting network's permutation, with a hand-written backward.

    Wire-major layout: the values are (n, batch), the columns (n, k, batch). A comparator with
    side σ computes v = σ·(lower − upper) and w = F(v), then moves w·(lower − upper) from the
    lower wire to the upper one; the columns go back through the layers with the same weights
    (Petersen et al. 2021, Eq. 2–3). The forward keeps v, w and the column gaps of each layer's
    window; the backward runs the column recursion forwards, then the value recursion backwards.
    """

    @staticmethod
    def forward(ctx, scores, plans, k, relaxation, steepness, art_lambda):
        x = scores.t().contiguous()
        n, batch = x.shape
        widest = max((layer.size for layer in plans), default=0)
        signed = x.new_zeros(len(plans), widest, batch)
        weights = torch.zeros_like(signed)
        for layer, v, w in zip(plans, signed, weights):
            lower, upper = layer.pairs(x)
            v, w = v[:layer.size], w[:layer.size]
            torch.sub(lower, upper, out=layer.shaped(v))
            gap = v if layer.ascending else v.clone()
            if not layer.ascending:
                v.mul_(layer.side)
            w.copy_(relaxation.weight(v, steepness, art_lambda))
            layer.mix(x, lower, upper, layer.shaped(w), layer.shaped(gap))
        columns = x.new_zeros(n, k, batch)
        ranks = torch.arange(k, device=x.device)
        columns[n - 1 - ranks, ranks] = 1.0
        gaps = [None] * len(plans)
        for depth in range(len(plans) - 1, -1, -1):
            layer = plans[depth]
            lower, upper = layer.pairs(columns, layer.first)
            gaps[depth] = lower - upper
            layer.mix(columns, lower, upper, layer.shaped(weights[depth, layer.first:layer.size], inner=1),
                      gaps[depth], layer.first)
        ctx.save_for_backward(signed, weights, *gaps)
        ctx.plans, ctx.relaxation, ctx.steepness, ctx.art_lambda = plans, relaxation, steepness, art_lambda
        return columns.permute(2, 0, 1)

    @staticmethod
    def backward(ctx, grad_output):
        plans = ctx.plans
        signed, weights, *gaps = ctx.saved_tensors
        grad = torch.empty(grad_output.shape[1:] + grad_output.shape[:1], dtype=grad_output.dtype,
                           device=grad_output.device)
        grad.copy_(grad_output.permute(1, 2, 0))
        batch = grad.shape[-1]
        grad_weights = torch.zeros_like(weights)
        for layer, weight, grad_weight, gap in zip(plans, weights, grad_weights, gaps):
            lower, upper = layer.pairs(grad, layer.first)
            grad_gap = lower - upper
            torch.sum(grad_gap * gap, dim=-2, out=layer.shaped(grad_weight[layer.first:layer.size]))
            layer.mix(grad, lower, upper, layer.shaped(weight[layer.first:layer.size], inner=1), grad_gap, layer.first)
        grad_weights.neg_()
        slopes = ctx.relaxation.slope(signed, weights, ctx.steepness, ctx.art_lambda)
        # With v = σ·(lower − upper) and w = F(v), the value gradients of a comparator change by
        # t on the lower wire and −t on the upper one, t = (g_up − g_low)·(w + v·F') + σ·F'·∂L/∂w.
        through_weights = grad_weights.mul_(slopes)
        keep = torch.addcmul(weights, signed, slopes)
        grad_x = weights.new_zeros(grad.shape[0], batch)
        for depth in range(len(plans) - 1, -1, -1):
            layer = plans[depth]
            lower, upper = layer.pairs(grad_x)
            through = through_weights[depth, :layer.size]
            if not layer.ascending:
                through = through * layer.side
            carried = torch.addcmul(layer.shaped(through), upper - lower, layer.shaped(keep[depth, :layer.size]))
            if layer.strided:
                lower.add_(carried)
                upper.sub_(carried)
            else:
                grad_x.index_copy_(0, layer.lower, lower + carried)
                grad_x.index_copy_(0, layer.upper, upper - carried)
        return grad_x.t(), None, None, None, None, None


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

    Examples
    --------
    >>> net = DiffSortNet("odd_even", steepness=100.0, distribution="logistic")
    >>> net.permutation(torch.tensor([[0.1, 3.0, -2.0, 1.0]]), 2).round()
    tensor([[[0., 0.],
             [1., 0.],
             [0., 0.],
             [0., 1.]]])

    References
    ----------
    Petersen, Borgelt, Kuehne & Deussen, "Differentiable Sorting Networks for Scalable Sorting and
    Ranking Supervision", ICML 2021; "Monotonic Differentiable Sorting Networks", ICLR 2022;
    Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022 (splitter selection).
    """

    gives_permutation = True

    def __init__(self, network: str = "odd_even", steepness: float = 10.0, distribution: str = "cauchy",
                 art_lambda: float = 0.25):
        super().__init__()
        if network not in NETWORKS:
            raise ValueError(f"network={network!r} is unknown; choose one of {', '.join(NETWORKS)}")
        self.network = network
        self.steepness = positive(steepness, "steepness", "larger is sharper")
        self.distribution = check_distribution(distribution)
        if isinstance(art_lambda, bool) or not isinstance(art_lambda, (int, float)) or art_lambda < 0:
            raise ValueError(f"art_lambda={art_lambda!r} must be a number >= 0")
        self.art_lambda = float(art_lambda)
        self._plans: dict[tuple, list[LayerPlan]] = {}

    def extra_repr(self) -> str:
        return f"{self.network}, steepness={self.steepness}, distribution={self.distribution}"

    def plans(self, n: int, k: int, device: torch.device, dtype: torch.dtype) -> list[LayerPlan]:
        """The network's layer plans for n wires and k outputs on ``device`` (cached)."""
        key = (n, k, str(device), dtype)
        if key not in self._plans:
            self._plans[key] = [layer.to(device, dtype) for layer in plan(NETWORKS[self.network](n, k), n, k)]
        return self._plans[key]

    def permutation(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        check_scores(scores, k, "DiffSortNet")
        low_precision = scores.dtype in (torch.float16, torch.bfloat16)
        values = scores.float() if low_precision else scores
        plans = self.plans(scores.shape[1], k, scores.device, values.dtype)
        columns = NetworkTopK.apply(values, plans, k, RELAXATIONS[self.distribution], self.steepness, self.art_lambda)
        return columns.to(scores.dtype)
