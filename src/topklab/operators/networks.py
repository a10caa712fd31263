"""Comparator layouts of the sorting and selection networks that DiffSortNets relax.

A network is a list of layers; a layer is a list of comparators ``(min_wire, max_wire)``: the
smaller of the two wire values leaves on ``min_wire``, the larger on ``max_wire``. Wires are
numbered so that, after the last layer, the largest value sits on wire n − 1, the second largest on
n − 2, and so on (ascending, as in diffsort and difftopk).

The layouts are those of diffsort 0.2.0 / difftopk 0.2.0, so that a DiffSortNet built on them gives
their P_topk (tested): odd-even transposition (n layers), bitonic (n padded to a power of two, the
padding wires dropped with the comparators that touch them) and Borgelt's splitter selection
network (top-k only, https://borgelt.net/topknet.html).
"""

from __future__ import annotations

import math

import torch

Layer = list[tuple[int, int]]


def odd_even_layers(n: int) -> list[Layer]:
    """Odd-even transposition sort: layer ℓ compares neighbours (i, i+1) for i ≡ ℓ (mod 2)."""
    return [[(i, i + 1) for i in range(layer % 2, n - 1, 2)] for layer in range(n)]


def bitonic_layers(n: int) -> list[Layer]:
    """Batcher's bitonic sort on the next power of two; the first (width − n) wires are dropped."""
    width = 1 << max(0, (n - 1).bit_length())
    dropped = width - n
    layers = []
    for block in range(width.bit_length() - 1):
        for span in (1 << s for s in range(block, -1, -1)):
            layer = []
            for low in range(width):
                high = low + span
                if low & span or low < dropped:
                    continue
                descending = (low >> (block + 1)) & 1
                pair = (high, low) if descending else (low, high)
                layer.append((pair[0] - dropped, pair[1] - dropped))
            layers.append(layer)
    return layers


def splitter_cascade(lanes: list[int]) -> list[Layer]:
    """Borgelt's splitter cascade over ``lanes``: ⌈log2 m⌉ layers that halve section sizes; each
    comparator sends the larger value to the earlier lane of the list."""
    layers = []
    depth = math.ceil(math.log2(len(lanes))) if len(lanes) > 1 else 0
    for level in range(depth):
        section = 1 << (depth - level - 1)
        layers.append(
            [
                (lanes[j], lanes[j + section])
                for start in range(0, len(lanes), 2 * section)
                for j in range(start, min(start + section, len(lanes) - section))
            ]
        )
    return layers


def splitter_selection_layers(n: int, k: int) -> list[Layer]:
    """Borgelt's top-k selection network from splitter cascades (as difftopk builds it).

    Lanes are tracked with the smallest rank (0 = largest) their value can still have. While some
    group of lanes shares a rank below k, a splitter cascade over that group refines their ranks;
    position j of a cascade adds 2^popcount(j) − 1 to its lane's rank. The cascades are placed at
    the earliest layer after their lanes' last use. Lanes are finally mirrored so that the top-k
    leave on wires n − k .. n − 1.
    """
    rank_gain = [2 ** bin(j).count("1") - 1 for j in range(n)]
    min_rank = [0] * n
    free_from = [0] * n
    layers: list[Layer] = []
    settled = -1
    grew = True
    while grew:
        grew = False
        for rank in range(k - 1, settled, -1):
            group = [lane for lane in range(n) if min_rank[lane] == rank]
            if len(group) < 2:
                continue
            cascade = splitter_cascade(group)
            start = max(free_from[lane] for lane in group)
            layers.extend([] for _ in range(start + len(cascade) - len(layers)))
            for offset, comparators in enumerate(cascade):
                layers[start + offset].extend(comparators)
            for position, lane in enumerate(group):
                min_rank[lane] += rank_gain[position]
                free_from[lane] = start + len(cascade)
            grew = True
        settled += 1
    return [[(n - 1 - small, n - 1 - large) for large, small in layer] for layer in layers]


NETWORKS = {
    "odd_even": lambda n, k: odd_even_layers(n),
    "bitonic": lambda n, k: bitonic_layers(n),
    "splitter_selection": splitter_selection_layers,
}


class LayerPlan:
    """One layer as comparators (lower wire, upper wire), sorted by upper wire, with the side σ of
    each (+1: the minimum leaves on the lower wire, −1: on the upper one).

    When the lower wires are ``start + 2·span·b + j`` (b < blocks, j < span) and each upper wire is
    its lower wire + span (every odd-even and power-of-two bitonic layer), the pairs are two strided
    views of a wire-major state and the layer needs no gather (``strided``); otherwise the wires
    are gathered and scattered by index.
    """

    def __init__(self, comparators: Layer, window: int):
        pairs = sorted((min(a, b), max(a, b), 1.0 if a < b else -1.0) for a, b in comparators)
        self.size = len(pairs)
        self.lower = torch.tensor([p[0] for p in pairs], dtype=torch.long)
        self.upper = torch.tensor([p[1] for p in pairs], dtype=torch.long)
        self.side = torch.tensor([p[2] for p in pairs])
        self.ascending = all(p[2] > 0 for p in pairs)
        self.strided = False
        spans = {up - low for low, up, _ in pairs}
        if len(spans) == 1:
            self.span, self.start = next(iter(spans)), pairs[0][0]
            self.blocks = self.size // self.span
            lowers = [self.start + 2 * self.span * b + j for b in range(self.blocks) for j in range(self.span)]
            self.strided = lowers == [p[0] for p in pairs]
        # The top-k columns are zero below the window's wire: comparators with both wires below it
        # leave them unchanged, so the column passes skip them (a prefix, whole blocks when strided).
        first = sum(1 for _, up, _ in pairs if up < window)
        self.first = first - first % self.span if self.strided else first

    def to(self, device, dtype) -> LayerPlan:
        self.lower, self.upper = self.lower.to(device), self.upper.to(device)
        self.side = self.side.to(device=device, dtype=dtype)[:, None]
        return self

    def pairs(self, state: torch.Tensor, first: int = 0):
        """(lower, upper) wires of comparators ``first:``, shaped (comparators, ...): strided views
        of the contiguous ``state`` (updated in place by :meth:`mix`) or gathered copies."""
        if not self.strided:
            return state.index_select(0, self.lower[first:]), state.index_select(0, self.upper[first:])
        blocks = self.blocks - first // self.span
        begin = self.start + 2 * self.span * (first // self.span)
        pairs = state[begin : begin + 2 * self.span * blocks].view(blocks, 2, self.span, *state.shape[1:])
        return pairs[:, 0], pairs[:, 1]

    def shaped(self, values: torch.Tensor, inner: int = 0) -> torch.Tensor:
        """Per-comparator ``values`` (comparators, batch) shaped like :meth:`pairs`' output, with
        ``inner`` singleton dimensions before the batch."""
        shape = (-1, self.span) if self.strided else (-1,)
        return values.view(*shape, *(1,) * inner, values.shape[-1])

    def mix(self, state: torch.Tensor, lower, upper, weight, gap, first: int = 0) -> None:
        """lower −= weight·gap and upper += weight·gap, in place on ``state``."""
        if self.strided:
            lower.addcmul_(weight, gap, value=-1.0)
            upper.addcmul_(weight, gap)
        else:
            state.index_copy_(0, self.lower[first:], torch.addcmul(lower, weight, gap, value=-1.0))
            state.index_copy_(0, self.upper[first:], torch.addcmul(upper, weight, gap))

    def shift(self, state: torch.Tensor, lower, upper, amount) -> None:
        """lower += amount and upper −= amount, in place on ``state`` (all comparators)."""
        if self.strided:
            lower.add_(amount)
            upper.sub_(amount)
        else:
            state.index_copy_(0, self.lower, lower + amount)
            state.index_copy_(0, self.upper, upper - amount)


def plan(layers: list[Layer], n: int, k: int) -> list[LayerPlan]:
    """The layers as :class:`LayerPlan`s, each with its column window: the lowest wire on which the
    top-k columns can be non-zero, propagated back from the k output wires through later layers."""
    support = set(range(n - k, n))
    windows = [0] * len(layers)
    for depth in range(len(layers) - 1, -1, -1):
        for a, b in layers[depth]:
            if a in support or b in support:
                support |= {a, b}
        windows[depth] = min(support)
    return [LayerPlan(layer, window) for layer, window in zip(layers, windows)]
