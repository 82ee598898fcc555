"""The model-family registry: each backbone module registers itself here (like the methods' registry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def image_input(batch: int, input_shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """A batch of example inputs (cost measurements): zeros, or standard normal values when seeded."""
    if generator is None:
        return torch.zeros(batch, *input_shape)
    return torch.randn(batch, *input_shape, generator=generator)


def token_input(batch: int, input_shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """A batch of example token ids for cost measurements: all 1 (no pad token; what it costs does not depend on
    which tokens, and id 1 is in every vocabulary)."""
    return torch.ones((batch, *input_shape), dtype=torch.long)


@dataclass(frozen=True)
class FamilyEntry:
    """How to build a registered backbone: its blocks, default exits, width-scaled sizes and builder."""

    num_blocks: int | Callable[[], int]  # or a function reading it (a pretrained encoder's layers)
    default_exits: tuple[int, ...] | None  # 0-based blocks an exit reads by default (None: every block)
    channels: tuple[int, ...]  # what a width ratio scales at width 1 (channels, or the ViT's heads)
    builder: Callable  # builder(input_shape, num_classes, *, width, depth, norm, exit_after) -> MultiExitModel
    pretrained: bool = False  # built from pretrained weights: its builder takes finetune and adapter_rank
    text: bool = False  # reads token ids (N, L); else images (N, C, H, W)
    dense: bool = False  # some layers read concatenated channel chunks (models.chunks): see ModelFamily.chunks

    @property
    def example_input(self) -> Callable[..., torch.Tensor]:
        """example_input(batch, input_shape, generator): example inputs of what this family reads."""
        return token_input if self.text else image_input

    def blocks(self) -> int:
        """The number of blocks of the global model."""
        return self.num_blocks() if callable(self.num_blocks) else self.num_blocks

    def exits(self) -> tuple[int, ...]:
        """The blocks the default exits read."""
        return tuple(range(self.blocks())) if self.default_exits is None else self.default_exits


FAMILIES: dict[str, FamilyEntry] = {}


def register_family(name: str, entry: FamilyEntry) -> None:
    """Make the backbone ``name`` available to ``model_family`` (and so to ``--model``)."""
    if name in FAMILIES:
        raise ValueError(f"model family '{name}' is registered twice")
    FAMILIES[name] = entry
