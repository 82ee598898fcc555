"""A Vision Transformer written from scratch, with an exit head after chosen blocks.

Patch embedding (a conv with kernel = stride = patch), a learned CLS token and positional
embedding, then pre-norm blocks (x + MHSA(LN(x)); x + MLP(LN(x)), GELU). Every block has the
same shapes, which InclusiveFL's momentum distillation needs. An exit is LayerNorm + Linear on the
CLS token, as in ReeFL and the InclusiveFL ViT port; the ``between`` hook of ``MultiExitModel``
lets a caller read or replace the CLS token between blocks (ReeFL).

The ViT always normalises with LayerNorm (the ``norm`` option concerns BatchNorm backbones).
Defaults are sized for 28x28 inputs on a CPU: a 4x4 grid of patches (7x7 pixels each; 8x8 on
32x32 inputs; patches of at least 4x4 pixels), dim 64, 6 blocks, 4 heads, MLP ratio 2. Width scaling keeps the head size and scales the number of heads, with q, k and v
as separate projections, so a width-r model is the leading corner of every tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HetflError
from .base import MultiExitModel, scaled
from .registry import FamilyEntry, register_family

DIM, DEPTH, HEADS, GRID, MIN_PATCH, MLP_RATIO = 64, 6, 4, 4, 4, 2


class PatchStem(nn.Module):
    """Image -> (B, 1 + patches, dim): patch embedding, CLS token in front, positional embedding added."""

    def __init__(self, channels: int, size: tuple[int, int], patch: int, dim: int):
        super().__init__()
        if size[0] % patch or size[1] % patch:
            raise HetflError(f"the ViT's patch size {patch} must divide the image size {size[0]}x{size[1]}")
        self.proj = nn.Conv2d(channels, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 1 + (size[0] // patch) * (size[1] // patch), dim) * 0.02)

    def forward(self, x):
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1) + self.pos


class Block(nn.Module):
    """Pre-norm transformer block: x + MHSA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, n, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ClsExit(nn.Module):
    """LayerNorm + Linear on the CLS token.

    ``pool`` is the token summary an exit reads and ``replace`` writes a new summary into the
    features the next block reads: ReeFL's Ree reads and modulates the same summary (models.ree).
    """

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, h, mask=None):
        return self.head(self.pool(h, mask))

    def head(self, summary: torch.Tensor) -> torch.Tensor:
        """(B, D) summary -> (B, classes) logits."""
        return self.fc(self.norm(summary))

    @staticmethod
    def pool(h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, D): the CLS token."""
        return h[:, 0]

    @staticmethod
    def replace(h: torch.Tensor, summary: torch.Tensor, mask: torch.Tensor | None = None,
                current: torch.Tensor | None = None) -> torch.Tensor:
        """The features with ``summary`` (B, D) in place of the CLS token, every other token as it was."""
        return torch.cat([summary[:, None], h[:, 1:]], dim=1)


def build_vit(input_shape, num_classes, *, width, depth, norm, exit_after: tuple[int, ...] | None = None,
              dim: int = DIM, num_blocks: int = DEPTH, heads: int = HEADS, patch: int | None = None,
              mlp_ratio: int = MLP_RATIO) -> MultiExitModel:
    """A ViT cut to ``depth`` blocks at ``width`` (heads scaled), exits after ``exit_after`` (default every block)."""
    depth = num_blocks if depth is None else depth
    exit_after = tuple(range(num_blocks)) if exit_after is None else exit_after
    kept_heads = scaled(heads, width)
    d = kept_heads * (dim // heads)
    patch = patch or max(MIN_PATCH, input_shape[1] // GRID)  # a GRID x GRID grid of patches by default
    stem = PatchStem(input_shape[0], tuple(input_shape[1:]), patch, d)
    blocks = [Block(d, kept_heads, mlp_ratio) for _ in range(depth)]
    kept = tuple(b for b in exit_after if b < depth)
    return MultiExitModel(stem, blocks, [ClsExit(d, num_classes) for _ in kept], kept)


register_family("vit", FamilyEntry(DEPTH, tuple(range(DEPTH)), (HEADS,), build_vit))
