"""A decoder-only Transformer language model whose chosen blocks may route tokens (Mixture-of-Depths).

A routed block processes only the tokens its router selects: they are gathered (in order) into a
shorter sequence, attend causally among themselves, and their block update, scaled by the router's
gate, is added back; every other token skips the block on the residual stream (Raposo et al. 2024).
The compute saved is real: a block at capacity c runs on about c·L tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from topklab.models.transformer import FIRST_POSITION, EncoderLayer, sinusoidal_positions


def causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) attention mask: position j sees positions <= j that are valid, and itself."""
    length = valid.shape[1]
    lower = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    return (lower & valid[:, None, None, :]) | torch.eye(length, dtype=torch.bool, device=valid.device)


def run_routed(layer: nn.Module, x: torch.Tensor, selected: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x + gate·(layer(x_S) − x_S)`` on the selected tokens S of each row, x elsewhere."""
    counts = selected.sum(1)
    width = int(counts.max())
    if width == 0:
        return x
    order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)[:, :width]  # selected first, in order
    valid = torch.arange(width, device=x.device)[None] < counts[:, None]
    index = order[..., None].expand(-1, -1, x.shape[-1])
    gathered = x.gather(1, index)
    update = (layer(gathered, causal_mask(valid)) - gathered) * (gate.gather(1, order) * valid)[..., None].to(x.dtype)
    return x.scatter_add(1, index, update)


class TransformerLM(nn.Module):
    """Pre-norm decoder-only Transformer over a subword vocabulary, input and output embeddings tied.

    Parameters
    ----------
    vocab_size : int, pieces (given by the data); pad_id : int, the padding id (given by the data)
    d_model : int (even, divisible by heads); ffn_dim : int; heads : int
    layers : int >= 1
    dropout : float in [0, 1), after the embeddings and each sublayer
    router : None (dense) or a callable ``(dim) -> router`` (a Hydra ``_partial_`` of
        :mod:`topklab.models.routing`), one router made per routed layer
    routed_layers : list of layer indices that route (default: every other layer from the second,
        as Mixture-of-Depths does)

    Examples
    --------
    >>> from functools import partial
    >>> from topklab.data.translation import PairBatch
    >>> from topklab.models.routing import TopKRouter
    >>> model = TransformerLM(vocab_size=11, d_model=8, ffn_dim=16, heads=2, layers=2, router=partial(TopKRouter, capacity=0.5))
    >>> tokens = torch.tensor([[2, 5, 6, 7]])
    >>> model(PairBatch(tokens[:, :0], tokens)).shape, model.last_routed.tolist()
    (torch.Size([1, 4, 11]), [[2]])
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int = 0,
        d_model: int = 256,
        ffn_dim: int = 1024,
        heads: int = 4,
        layers: int = 4,
        dropout: float = 0.1,
        router=None,
        routed_layers: list[int] | None = None,
    ):
        super().__init__()
        if d_model % 2 or d_model % heads:
            raise ValueError(f"model.d_model={d_model} must be even and divisible by model.heads={heads}")
        if layers < 1:
            raise ValueError(f"model.layers={layers} must be >= 1")
        if not 0 <= dropout < 1:
            raise ValueError(f"model.dropout={dropout} must lie in [0, 1)")
        routed = list(range(1, layers, 2)) if routed_layers is None else [int(i) for i in routed_layers]
        if router is not None and (not routed or any(not 0 <= i < layers for i in routed)):
            raise ValueError(f"model.routed_layers={routed} must name layers in [0, {layers})")
        self.pad_id, self.d_model, self.dropout = pad_id, d_model, dropout
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embedding.weight, 0.0, d_model**-0.5)
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, ffn_dim, heads, dropout, 0.0, 0.0, True) for _ in range(layers)
        )
        self.routed_layers = routed if router is not None else []
        self.routers = nn.ModuleDict({str(i): router(d_model) for i in self.routed_layers})
        self.norm = nn.LayerNorm(d_model)
        self.last_routed = None

    @property
    def causal(self) -> bool:
        """Whether a token's output depends only on earlier tokens (token-by-token decoding agrees)."""
        return all(getattr(r, "causal", True) for r in self.routers.values())

    def parameter_groups(self) -> list[dict]:
        """One group for the network, then each router's λ groups (its rule's: no weight decay; its own
        constant learning rate where the router sets ``lam_lr``)."""
        thresholds = [group for router in self.routers.values() for group in _router_groups(router)]
        own = {id(p) for group in thresholds for p in group["params"]}
        return [{"params": [p for p in self.parameters() if p.requires_grad and id(p) not in own]}, *thresholds]

    def pop_epoch_diagnostics(self) -> dict:
        """The share of real tokens each routed layer processed in training since the last call
        (``train_routed_fraction_layer<i>``; the engine adds them to each epoch's row)."""
        return {f"train_routed_fraction_layer{i}": router.pop_training_fraction() for i, router in self.routers.items()}

    def auxiliary_loss(self) -> torch.Tensor:
        """The routers' training terms of the last forward (the top-k predictor's BCE, the STk
        threshold's objective under the gradient update; else 0)."""
        return sum((r.auxiliary_loss for r in self.routers.values()), torch.zeros(()))

    def forward(self, batch) -> torch.Tensor:
        """Logits (B, L, V) for ``batch.decoder_input`` (bos + tokens); ``last_routed`` (B, routed
        layers) counts the tokens of each row every routed layer processed."""
        tokens = batch.decoder_input
        real = tokens != self.pad_id
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        x = x + sinusoidal_positions(tokens.shape[1], self.d_model, FIRST_POSITION, tokens.device).to(x.dtype)
        x = F.dropout(x, self.dropout, self.training)
        mask, routed = causal_mask(real), []
        for i, layer in enumerate(self.layers):
            if str(i) in self.routers:
                selected, gate = self.routers[str(i)](x, real)
                routed.append(selected.sum(1))
                x = run_routed(layer, x, selected, gate)
            else:
                x = layer(x, mask)
        self.last_routed = torch.stack(routed, 1) if routed else torch.zeros(len(tokens), 0, dtype=torch.long)
        return F.linear(self.norm(x), self.embedding.weight)


def _router_groups(router) -> list[dict]:
    """A router's λ groups (empty for routers without a learned threshold)."""
    return router.parameter_groups() if hasattr(router, "parameter_groups") else []
