"""Parameter-efficient branches for a frozen timm ViT, one class per method (PEL/LIFT's
definitions; Shi et al. 2024). Each ``attach(vit, num_classes)`` edits the ViT in place and returns
the parameters it trains; the backbone's own weights stay frozen unless the method trains them."""

from __future__ import annotations

import math

import torch
from torch import nn


def default_rank(num_classes: int, layers: int) -> int:
    """PEL/LIFT's bottleneck width: 2^max(0, ⌊log2(C / 2L)⌋) (CIFAR-100: 4, Places-LT: 8, ImageNet-LT: 32)."""
    return 2 ** max(0, int(math.log2(num_classes / (2 * layers))))


class AdaptFormerBranch(nn.Module):
    """``s · up(ReLU(down(LN(h))))`` with a learnable scalar s (init 1); up is zero at init, so the
    branch adds nothing at step 0 (PEL/LIFT's AdaptFormer)."""

    def __init__(self, dim: int, rank: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.down, self.up = nn.Linear(dim, rank), nn.Linear(rank, dim)
        nn.init.kaiming_normal_(self.down.weight, a=math.sqrt(5))
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.scale * self.up(torch.relu(self.down(self.norm(h))))


class AdaptFormerBlock(nn.Module):
    """A timm ViT block whose MLP gets a parallel AdaptFormer branch fed the post-attention stream:
    ``h = x + attn(norm1(x)); out = h + mlp(norm2(h)) + branch(h)``."""

    def __init__(self, block: nn.Module, branch: AdaptFormerBranch):
        super().__init__()
        self.block, self.branch = block, branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        h = x + b.drop_path1(b.ls1(b.attn(b.norm1(x))))
        return h + b.drop_path2(b.ls2(b.mlp(b.norm2(h)))) + self.branch(h)


class AdaptFormer:
    """AdaptFormer (Chen et al. 2022) as PEL/LIFT build it, in every block.

    Parameters
    ----------
    rank : int >= 1 or None, the bottleneck width (None: :func:`default_rank` of the classes)

    Examples
    --------
    >>> import timm
    >>> vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32)
    >>> trained = AdaptFormer(rank=2).attach(vit, num_classes=10)
    >>> sum(p.numel() for p in trained)  # 12 × (LN 2·192 + down 192·2 + 2 + up 2·192 + 192 + scale 1)
    16164
    """

    def __init__(self, rank: int | None = None):
        self.rank = rank

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        rank = self.rank or default_rank(num_classes, len(vit.blocks))
        branches = [AdaptFormerBranch(vit.num_features, rank) for _ in vit.blocks]
        vit.blocks = nn.Sequential(*(AdaptFormerBlock(b, a) for b, a in zip(vit.blocks, branches)))
        return [p for branch in branches for p in branch.parameters()]


class LoRAQKV(nn.Module):
    """A fused qkv projection plus low-rank updates of q and v: ``q += (1/r)·x A_q B_q`` (same for
    v); B is zero at init (PEL/LIFT's LoRA: α = 1)."""

    def __init__(self, qkv: nn.Linear, rank: int):
        super().__init__()
        self.qkv, self.rank = qkv, rank
        dim = qkv.in_features
        self.a = nn.ParameterList(nn.Parameter(torch.empty(dim, rank)) for _ in range(2))
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(rank, dim)) for _ in range(2))
        for a in self.a:
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q + (x @ self.a[0] @ self.b[0]) / self.rank
        v = v + (x @ self.a[1] @ self.b[1]) / self.rank
        return torch.cat([q, k, v], dim=-1)


class LoRA:
    """LoRA (Hu et al. 2022) on the query and value projections of every block.

    Parameters
    ----------
    rank : int >= 1 or None (None: :func:`default_rank`)
    """

    def __init__(self, rank: int | None = None):
        self.rank = rank

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        rank = self.rank or default_rank(num_classes, len(vit.blocks))
        wrapped = []
        for block in vit.blocks:
            block.attn.qkv = LoRAQKV(block.attn.qkv, rank)
            wrapped.append(block.attn.qkv)
        return [p for w in wrapped for p in (*w.a, *w.b)]


class PromptedBlock(nn.Module):
    """A block that first replaces the tokens after the first ``keep`` with its prompts (deep VPT),
    or appends them when there are none yet."""

    def __init__(self, block: nn.Module, prompts: nn.Parameter | None, keep: int):
        super().__init__()
        self.block, self.prompts, self.keep = block, prompts, keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prompts is not None:
            x = torch.cat([x[:, : self.keep], self.prompts.expand(len(x), -1, -1).to(x.dtype)], dim=1)
        return self.block(x)


class VPT:
    """Visual prompt tuning (Jia et al. 2022): ``length`` learnable tokens appended after the
    sequence, without position embedding; ``deep`` gives each block its own (else only the first).

    Parameters
    ----------
    length : int >= 1 (PEL/LIFT: 10); deep : bool
    """

    def __init__(self, length: int = 10, deep: bool = True):
        if length < 1:
            raise ValueError(f"model.tuner.length={length} must be >= 1")
        self.length, self.deep = length, deep

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        dim = vit.num_features
        patch = vit.patch_embed.patch_size
        bound = math.sqrt(6.0 / (3 * patch[0] * patch[1] + dim))
        keep = vit.patch_embed.num_patches + vit.num_prefix_tokens
        prompts = []
        blocks = []
        for i, block in enumerate(vit.blocks):
            p = nn.Parameter(torch.empty(1, self.length, dim).uniform_(-bound, bound)) if self.deep or i == 0 else None
            prompts += [p] if p is not None else []
            blocks.append(PromptedBlock(block, p, keep))
        vit.blocks = nn.Sequential(*blocks)
        return prompts


class BiasOnly:
    """BitFit (Ben Zaken et al. 2022): every bias inside the blocks (attention, MLP, LayerNorm)."""

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        return [p for name, p in vit.blocks.named_parameters() if name.endswith("bias")]


class LinearProbe:
    """No branch: only the classifier trains."""

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        return []


class FullFineTuning:
    """Every block trains (PEL/LIFT's "full": patch and position embeddings and the last norm stay frozen)."""

    def attach(self, vit: nn.Module, num_classes: int) -> list[nn.Parameter]:
        return list(vit.blocks.parameters())
