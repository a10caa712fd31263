"""An encoder-decoder Transformer for translation (Vaswani et al. 2017) in fairseq's shapes.

``transformer_iwslt_de_en`` is ``Transformer(d_model=512, ffn_dim=1024, heads=4, layers=6+6,
dropout=0.3)`` with shared decoder input/output embeddings; the WMT base shape has ffn_dim=2048
and heads=8. Positions are sinusoidal and count from 2 (fairseq's padding_idx + 1), embeddings are
scaled by √d_model, and layers are post-norm (pre-norm is a field). Initialisation as fairseq's:
embeddings N(0, d^-½) with a zero pad row, attention projections Xavier-uniform (q/k/v with gain
1/√2), feed-forward layers PyTorch's default. :meth:`Transformer.decode` runs either on a whole target prefix or one
step at a time with cached keys and values (incremental decoding, for search).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FIRST_POSITION = 2  # fairseq numbers positions from padding_idx + 1 (its pad id is 1)


def sinusoidal_positions(length: int, dim: int, offset: int = 0, device=None) -> torch.Tensor:
    """(length, dim) sinusoidal encodings of positions offset..offset+length−1: sines in the first
    half of the features, cosines in the second (fairseq's layout); dim must be even."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float32, device=device) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(offset, offset + length, dtype=torch.float32, device=device)[:, None] * frequencies[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class Attention(nn.Module):
    """Multi-head attention with separate q/k/v projections; ``cache`` holds keys and values of
    earlier steps (self-attention) or of the encoder output (cross-attention)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        for projection in (self.q, self.k, self.v):
            nn.init.xavier_uniform_(projection.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        return x.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        memory: torch.Tensor | None,
        mask: torch.Tensor | None,
        cache: dict | None = None,
        kind: str = "self",
        causal: bool = False,
    ) -> torch.Tensor:
        q = self._split(self.q(query))
        if cache is not None and kind == "cross" and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            source = query if memory is None else memory
            k, v = self._split(self.k(source)), self._split(self.v(source))
            if cache is not None:
                if kind == "self" and "k" in cache:
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and mask is None, dropout_p=self.dropout if self.training else 0.0
        )
        batch, _, length, _ = out.shape
        return self.out(out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.activation_dropout = activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(F.relu(self.fc1(x)), self.activation_dropout, self.training))


class Sublayer(nn.Module):
    """x + dropout(f(x)) with layer norm before f (pre-norm) or after the sum (post-norm)."""

    def __init__(self, dim: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm, self.dropout, self.pre_norm = nn.LayerNorm(dim), dropout, pre_norm

    def forward(self, x: torch.Tensor, f) -> torch.Tensor:
        if self.pre_norm:
            return x + F.dropout(f(self.norm(x)), self.dropout, self.training)
        return self.norm(x + F.dropout(f(x), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, dim, ffn_dim, heads, dropout, attention_dropout, activation_dropout, pre_norm):
        super().__init__()
        self.attention = Attention(dim, heads, attention_dropout)
        self.ffn = FeedForward(dim, ffn_dim, activation_dropout)
        self.attention_block, self.ffn_block = Sublayer(dim, dropout, pre_norm), Sublayer(dim, dropout, pre_norm)

    def forward(self, x, mask):
        x = self.attention_block(x, lambda h: self.attention(h, None, mask))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, dim, ffn_dim, heads, dropout, attention_dropout, activation_dropout, pre_norm):
        super().__init__()
        self.self_attention = Attention(dim, heads, attention_dropout)
        self.cross_attention = Attention(dim, heads, attention_dropout)
        self.ffn = FeedForward(dim, ffn_dim, activation_dropout)
        self.blocks = nn.ModuleList(Sublayer(dim, dropout, pre_norm) for _ in range(3))

    def forward(self, x, memory, memory_mask, cache: dict | None):
        self_cache = None if cache is None else cache.setdefault("self", {})
        cross_cache = None if cache is None else cache.setdefault("cross", {})
        # a full prefix is causal; one cached step attends to every earlier step
        x = self.blocks[0](x, lambda h: self.self_attention(h, None, None, self_cache, "self", causal=cache is None))
        x = self.blocks[1](x, lambda h: self.cross_attention(h, memory, memory_mask, cross_cache, "cross"))
        return self.blocks[2](x, self.ffn)


class Transformer(nn.Module):
    """Encoder-decoder Transformer over one joint vocabulary.

    Parameters
    ----------
    vocab_size : int, subword pieces (given by the data)
    pad_id : int, the padding id (given by the data); its embedding is zero
    d_model : int, model width (even); ffn_dim : int, hidden width of the feed-forward blocks
    heads : int dividing d_model
    encoder_layers, decoder_layers : int >= 1
    dropout : float in [0, 1), after embeddings and each sublayer; attention_dropout,
        activation_dropout : float in [0, 1), on attention weights and inside the feed-forward block
    pre_norm : bool, layer norm before each sublayer (plus a final one) instead of after the sum
    share_decoder_embeddings : bool, the output projection is the decoder's input embedding
    share_all_embeddings : bool, encoder and decoder also share one embedding (joint vocabulary)

    Examples
    --------
    >>> from topklab.data.translation import PairBatch
    >>> model = Transformer(vocab_size=11, d_model=8, ffn_dim=16, heads=2, encoder_layers=1, decoder_layers=1)
    >>> model(PairBatch(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]]))).shape
    torch.Size([1, 2, 11])
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int = 0,
        d_model: int = 512,
        ffn_dim: int = 1024,
        heads: int = 4,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        dropout: float = 0.3,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        pre_norm: bool = False,
        share_decoder_embeddings: bool = True,
        share_all_embeddings: bool = False,
    ):
        super().__init__()
        if d_model % 2 or d_model % heads:
            raise ValueError(f"model.d_model={d_model} must be even and divisible by model.heads={heads}")
        if min(encoder_layers, decoder_layers) < 1:
            raise ValueError("model.encoder_layers and model.decoder_layers must be >= 1")
        for name, p in (
            ("dropout", dropout),
            ("attention_dropout", attention_dropout),
            ("activation_dropout", activation_dropout),
        ):
            if not 0 <= p < 1:
                raise ValueError(f"model.{name}={p} must lie in [0, 1)")
        self.pad_id, self.d_model, self.dropout, self.pre_norm = pad_id, d_model, dropout, pre_norm
        self.source_embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.source_embedding.weight, 0.0, d_model**-0.5)
        with torch.no_grad():
            self.source_embedding.weight[pad_id].zero_()
        if share_all_embeddings:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
            nn.init.normal_(self.target_embedding.weight, 0.0, d_model**-0.5)
            with torch.no_grad():
                self.target_embedding.weight[pad_id].zero_()
        layer_args = (d_model, ffn_dim, heads, dropout, attention_dropout, activation_dropout, pre_norm)
        self.encoder = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(decoder_layers))
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.output_projection = None
        if not share_decoder_embeddings:
            self.output_projection = nn.Linear(d_model, vocab_size, bias=False)
            nn.init.normal_(self.output_projection.weight, 0.0, d_model**-0.5)

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = embedding(tokens) * math.sqrt(self.d_model)
        x = x + sinusoidal_positions(tokens.shape[1], self.d_model, FIRST_POSITION + offset, tokens.device).to(x.dtype)
        return F.dropout(x, self.dropout, self.training)

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(memory (B, S, d), attention mask (B, 1, 1, S): True where a source position is real)."""
        mask = (source != self.pad_id)[:, None, None, :]
        x = self._embed(self.source_embedding, source)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.encoder_norm(x), mask

    def decode(
        self,
        decoder_input: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        cache: list[dict] | None = None,
        position: int = 0,
    ) -> torch.Tensor:
        """Logits (B, T, V) for a whole prefix (``cache`` None), or for the step(s) at ``position``
        onwards given ``cache``, the per-layer keys/values of the steps before (updated in place)."""
        x = self._embed(self.target_embedding, decoder_input, position)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, memory_mask, None if cache is None else cache[i])
        x = self.decoder_norm(x)
        weight = self.target_embedding.weight if self.output_projection is None else self.output_projection.weight
        return F.linear(x, weight)

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.decoder]

    @staticmethod
    def reorder_cache(cache: list[dict], order: torch.Tensor) -> None:
        """Keep the cached rows ``order`` (beam search picks which hypotheses go on)."""
        for layer in cache:
            for attention in layer.values():
                for key in attention:
                    attention[key] = attention[key].index_select(0, order)

    def forward(self, batch) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) for a :class:`~topklab.data.translation.PairBatch`."""
        memory, mask = self.encode(batch.source)
        return self.decode(batch.decoder_input, memory, mask)
