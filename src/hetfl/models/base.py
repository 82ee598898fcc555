"""The multi-exit model contract every backbone follows (DESIGN.md, "Contracts").

A model is a stem, an ordered list of blocks and a list of exits; exit i reads the features after
block ``exit_after[i]``. A depth-d model holds ``blocks[:d]`` and the exits that read them, under
the same parameter names as the global model, so depth slicing is a subset of names. A width-r
model is the same architecture built with ``ceil(r * channels)`` channels; every tensor of it is
the leading corner of the global tensor of the same name, so width slicing is a corner slice,
except where a layer reads a concatenation of earlier layers' outputs (MSDNet's dense layers,
``models.chunks``): there a width keeps the leading share of every concatenated chunk
(``slicing.SubModel.chunks``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .frozen_features import FrozenKey, frozen_summaries


@dataclass(frozen=True)
class ArchSpec:
    """Shape of a model family's global model: what a sub-model can be cut from."""

    num_blocks: int
    exit_after: tuple[int, ...]  # block index (0-based) each exit reads; increasing


BlockHook = Callable[[int, torch.Tensor], torch.Tensor]


def scaled(channels: int, width: float) -> int:
    """Channels kept at a width ratio: ceil(width * channels), at least 1 (HeteroFL's rounding)."""
    return max(1, math.ceil(channels * width - 1e-9))


class NoNorm(nn.Identity):
    """The place of a normalisation layer in a network built without one (``norm = none``).

    A marker, not an ordinary identity, so that HeteroFL's Scaler finds the same places with and
    without BatchNorm.
    """


def norm2d(channels: int, norm: str) -> nn.Module:
    """BatchNorm with batch statistics (no running buffers), or ``NoNorm``."""
    return nn.BatchNorm2d(channels, track_running_stats=False) if norm == "bn" else NoNorm()


class MultiExitModel(nn.Module):
    """A stem, blocks run one at a time, and exits; ``forward`` returns the logits of every exit it reaches."""

    # set by a pretrained builder when nothing before an exit trains: its exits' summaries may be read from a
    # store instead of running the blocks (models.frozen_features)
    frozen_key: FrozenKey | None = None

    def __init__(self, stem: nn.Module, blocks: list[nn.Module], exits: list[nn.Module], exit_after: tuple[int, ...],
                 pad_id: int | None = None):
        super().__init__()
        if len(exits) != len(exit_after):
            raise ValueError("one exit_after entry per exit")
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.exits = nn.ModuleList(exits)
        self.exit_after = tuple(exit_after)
        self.active = tuple(range(len(exits)))  # indices of the exits this model holds and runs
        self.pad_id = pad_id  # inputs are token ids with this pad token (a text encoder), or None

    def keep_exits(self, numbers) -> MultiExitModel:
        """Self, holding only the given 1-based exits; the others become parameter-free placeholders.

        Placeholders keep the ModuleList indices, so the kept exits' parameter names do not change.
        """
        keep = {n - 1 for n in numbers}
        for i in range(len(self.exits)):
            if i not in keep:
                self.exits[i] = nn.Identity()
        self.active = tuple(i for i in range(len(self.exits)) if i in keep)
        return self

    @property
    def exit_numbers(self) -> tuple[int, ...]:
        """1-based numbers of the exits this model holds, in the order ``forward`` returns them."""
        return tuple(i + 1 for i in self.active)

    @property
    def depth(self) -> int:
        """Number of blocks this model holds."""
        return len(self.blocks)

    def token_mask(self, x: torch.Tensor) -> torch.Tensor | None:
        """(B, T) True at a text encoder's real tokens (not padding); None for other inputs."""
        return None if self.pad_id is None else x != self.pad_id

    def block_inputs(self, x: torch.Tensor) -> dict:
        """Keyword arguments every block takes besides the features: a text encoder's key-padding mask, else none."""
        return {} if self.pad_id is None else {"mask": self.token_mask(x)[:, None, None, :]}

    def exit_inputs(self, x: torch.Tensor) -> dict:
        """Keyword arguments every exit takes besides the features: a text encoder's token mask, else none."""
        return {} if self.pad_id is None else {"mask": self.token_mask(x)}

    def hidden(self, x: torch.Tensor, between: BlockHook | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(b, the features after block b and the ``between`` hook) for every block, shallowest first."""
        h = self.stem(x)
        inputs = self.block_inputs(x)
        for b, block in enumerate(self.blocks):
            h = block(h, **inputs)
            if between is not None:
                h = between(b, h)
            yield b, h

    def forward(self, x: torch.Tensor, between: BlockHook | None = None) -> list[torch.Tensor]:
        """Logits of every exit this model holds, shallowest first.

        ``between(b, h)``, when given, is called after block ``b`` and returns the features the
        next block (and block ``b``'s exits) read: the place where a method acts between blocks
        (ReeFL writes Ree's output into the token summary there).
        """
        if between is None:
            summaries = frozen_summaries(self, x, {self.exit_after[i] for i in self.active})
            if summaries is not None:
                return [self.exits[i].head(summaries[self.exit_after[i]]) for i in self.active]
        inputs = self.exit_inputs(x)
        return [self.exits[i](h, **inputs) for b, h in self.hidden(x, between)
                for i in self.active if self.exit_after[i] == b]


def federated_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``model`` that travel and are aggregated: its state dict less the frozen parameters.

    A parameter with ``requires_grad`` off (a frozen pretrained backbone, the base weights under
    LoRA) is never trained, so every client already holds its value: it is built from the same
    pretrained files on both sides and never sent (ReeFL Table 1's "Comm. Cost").
    """
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    return {n: t for n, t in model.state_dict().items() if n not in frozen}


def classifier_names(model: nn.Module, num_classes: int) -> tuple[str, ...]:
    """Names of the weight and bias of every exit's classifier in ``model``: its Linear layers with ``num_classes``
    outputs under ``exits``, whose first dimension (one row per class) is never sliced."""
    return tuple(f"{name}.{kind}" for name, layer in model.named_modules()
                 if name.startswith("exits.") and isinstance(layer, nn.Linear) and layer.out_features == num_classes
                 for kind, tensor in (("weight", layer.weight), ("bias", layer.bias)) if tensor is not None)


class BaseEnsemble(nn.ModuleDict):
    """SplitMix's split model (Hong et al., 2022): independent base networks ``base{i}``, no shared parameter.

    ``forward`` returns the last exit's logits of every base, in index order: training sums their
    cross-entropies (each base learns alone), inference mixes them (the mean of the logits, the
    ensemble). Parameter names are ``base{i}.<the base's own name>``.
    """

    def __init__(self, bases: dict[int, MultiExitModel]):
        super().__init__({f"base{i}": model for i, model in sorted(bases.items())})
        self.exit_numbers = tuple(i + 1 for i in sorted(bases))  # "exit{i+1}" is base i alone

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The last exit's logits of every base."""
        return [base(x)[-1] for base in self.values()]
