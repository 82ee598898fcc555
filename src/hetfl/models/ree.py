"""ReeFL's recurrent early exit (Lee et al., ICML 2024, Sec. 3.2, Eq. 2-4) on a transformer backbone.

After every block l (every block, not only exits: Table 5), the block's summary token z^l joins
the history, and Ree, one pre-norm transformer layer shared by all blocks, reads
[z_meta, z^1, ..., z^l] + p[:l+1] (Eq. 2) and returns m^l = [m_0^l, ..., m_l^l]:

* Eq. (3) - at an exit block, the shared classifier (LayerNorm + Linear) reads m_0^l + z^l;
* Eq. (4) - modulation: the next block reads m_l^l in place of z^l (off for "ree-unmodulated",
  the ablation of Table 4).

What the history holds (the paper's q_cls; the authors' code keeps views that later writes
alias): the summary tokens as the blocks output them, z^1..z^l, before modulation; the
modulated m_l^l only replaces the backbone's summary (Fig. 1: m_l^l "is used to replace z^l as a
part of input to block l+1"). Nothing is written in place, so an entry never changes once stored
(tests/test_reefl.py checks it).

The summary token is the one the backbone's exits read (``ClsExit.pool``): the class token of
the ViT (the paper's DeiT), the mean of the real tokens of MiniLM, whose [CLS] token is nearly
constant across documents before its last layer (models.minilm); modulating a mean replaces it by
shifting every real token alike (``MeanExit.replace``), or, with head "ree-cls", Ree's output goes
into the [CLS] position alone, the other reading of Eq. (4) on such a backbone.

Sizes (Appendix A): 8 heads over a 16-dim attention bottleneck, an MLP of 1.35x the width with
GELU. The positional embedding has one row per block plus the meta token; a depth-d model holds
its leading d + 1 rows, the leading corner of the global model's, like every other sliced tensor.
Attention is scaled by the head size^-1/2 (the usual choice; the paper is silent). Ree's two residual
branches (attention output and MLP output) start at zero, so at round 0 m^l = [z_meta, z^1..z^l] + p:
the backbone reads its own class token (plus a 0.02-scale position) and the classifier z^l + m_0^l.
The paper is silent on Ree's initialisation; with PyTorch's default one, Ree's first output moved
MiniLM's 8-10-norm class token by 6-7 (measured), far from what the next pretrained layer expects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HetflError
from .base import MultiExitModel
from .frozen_features import frozen_summaries
from .vit import ClsExit

HEAD_KINDS = ("exits", "ree", "ree-cls", "ree-unmodulated")
REE_HEADS, REE_ATTN_DIM, REE_MLP_RATIO = 8, 16, 1.35


class Ree(nn.Module):
    """Eq. (2): history (B, l, dim) -> m (B, l + 1, dim), one pre-norm transformer layer over [meta, history] + p."""

    def __init__(self, dim: int, max_blocks: int, heads: int = REE_HEADS, attn_dim: int = REE_ATTN_DIM,
                 mlp_ratio: float = REE_MLP_RATIO):
        super().__init__()
        self.heads = heads
        self.meta = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, max_blocks + 1, dim) * 0.02)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * attn_dim)
        self.proj = nn.Linear(attn_dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(mlp_ratio * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        for out in (self.proj, self.mlp[2]):  # the residual branches start at zero: Ree starts as the identity
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        b, l, _ = history.shape
        x = torch.cat([self.meta.expand(b, -1, -1), history], dim=1) + self.pos[:, : l + 1]
        q, k, v = self.qkv(self.norm1(x)).view(b, l + 1, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, l + 1, -1))
        return x + self.mlp(self.norm2(x))


class SharedClassifier(nn.Module):
    """Eq. (3)'s classifier shared by every exit: LayerNorm + Linear."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, z):
        return self.fc(self.norm(z))


class ReeModel(MultiExitModel):
    """A backbone's stem and blocks with Ree after every block and the shared classifier at its exits."""

    def __init__(self, backbone: MultiExitModel, num_classes: int, modulate: bool = True, into_cls: bool = False):
        exits = list(backbone.exits)
        if not exits or not all(isinstance(e, ClsExit) for e in exits):
            raise HetflError("ReeFL needs a transformer backbone whose exits read a token summary: "
                             "use --model minilm or --model vit")
        dim = exits[0].fc.in_features
        # exits stay as parameter-free placeholders: they mark where the shared classifier reads
        super().__init__(backbone.stem, list(backbone.blocks), [nn.Identity() for _ in exits], backbone.exit_after,
                         backbone.pad_id)
        self.modulate = modulate
        self.frozen_key = backbone.frozen_key
        self.read_out = type(exits[0])  # the summary token z^l: the class token (ViT), the token mean (MiniLM)
        # where Eq. (4) writes m_l^l: in place of the summary (default), or into the class token alone ("ree-cls")
        self.write_in = ClsExit if into_cls else self.read_out
        self.ree = Ree(dim, len(backbone.blocks))
        self.head = SharedClassifier(dim, num_classes)

    def forward(self, x: torch.Tensor, between=None) -> list[torch.Tensor]:
        """Logits of every exit this model holds, shallowest first (Eq. 2-4 after every block)."""
        exit_blocks = {self.exit_after[i] for i in self.active}
        mask = self.token_mask(x)
        history: list[torch.Tensor] = []
        logits: list[torch.Tensor] = []

        def ree(b: int, z: torch.Tensor) -> torch.Tensor:
            history.append(z)
            m = self.ree(torch.stack(history, dim=1))  # Eq. (2)
            if b in exit_blocks:
                logits.append(self.head(m[:, 0] + z))  # Eq. (3)
            return m

        def ree_step(b: int, h: torch.Tensor) -> torch.Tensor:
            if between is not None:
                h = between(b, h)
            z = self.read_out.pool(h, mask)
            m = ree(b, z)
            return self.write_in.replace(h, m[:, -1], mask, current=z) if self.modulate else h  # Eq. (4)

        # without modulation the blocks read what they would without Ree: a frozen backbone's summaries may be stored
        stored = None if self.modulate or between is not None else frozen_summaries(self, x, range(self.depth))
        if stored is not None:
            for b in range(self.depth):
                ree(b, stored[b])
        else:
            for _ in self.hidden(x, ree_step):
                pass
        return logits
