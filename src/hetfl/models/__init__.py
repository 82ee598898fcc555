"""Model families: each builds the global model or any (depth, width) sub-model of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from ..errors import HetflError
from . import cifar_resnet, convnet, resnet, vit  # noqa: F401  (each registers its families)
from .base import ArchSpec, MultiExitModel, scaled
from .registry import FAMILIES, FamilyEntry, register_family


@dataclass(frozen=True)
class ModelFamily:
    """A backbone family bound to a dataset's shapes: ``build(depth, width)`` gives a sub-model."""

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    arch: ArchSpec
    builder: Callable[..., MultiExitModel] = field(compare=False)  # fixed by the name and the exits: equal families
    # (and so the cost model's caches) do not depend on which call made them
    base_width: float = 1.0  # the global model's own width multiplier
    norm: str = "bn"
    channels: tuple[int, ...] = ()  # what a width ratio scales (channels, or the ViT's heads), at width 1

    def build(self, depth: int | None = None, width: float = 1.0, seed: int | None = None) -> MultiExitModel:
        """A sub-model with ``depth`` blocks at ``width`` times the global channels, seeded if asked.

        Convolution weights are stored channels-last: oneDNN's CPU convolutions (and cuDNN's) run
        faster on it (measured here: training steps of the CNN ~20% faster, evaluation ~40%);
        values, and so results, are the same whatever the layout.
        """
        depth = self.arch.num_blocks if depth is None else depth
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            model = self.builder(self.input_shape, self.num_classes, width=self.base_width * width,
                                 depth=depth, norm=self.norm)
        return model.to(memory_format=torch.channels_last)

    def exits_at_depth(self, depth: int) -> int:
        """Number of exits a depth-``depth`` model holds."""
        return sum(1 for b in self.arch.exit_after if b < depth)

    def signature(self, width: float) -> tuple[int, ...]:
        """The channel counts a width ratio gives: two widths with one signature build the same architecture."""
        return tuple(scaled(c, self.base_width * width) for c in self.channels)

    def with_exits(self, exit_after: tuple[int, ...]) -> ModelFamily:
        """The same family with exits after the blocks ``exit_after`` (0-based, increasing)."""
        return model_family(self.name, self.input_shape, self.num_classes, self.base_width, self.norm, exit_after)


MODEL_NAMES = tuple(FAMILIES)
NORMS = ("bn", "none")


def model_family(name: str, input_shape: tuple[int, int, int], num_classes: int,
                 width: float = 1.0, norm: str = "bn", exit_after: tuple[int, ...] | None = None) -> ModelFamily:
    """The family called ``name`` for inputs of ``input_shape`` and ``num_classes`` classes.

    ``exit_after`` places the exits (0-based blocks, the last block included) where a method asks;
    by default the CNN and the ViT have an exit after every block, the ResNets after every stage.
    """
    if name not in FAMILIES:
        raise HetflError(f"model '{name}' is unknown; choose one of: {', '.join(FAMILIES)}")
    entry = FAMILIES[name]
    num_blocks = entry.num_blocks
    exits = tuple(entry.default_exits if exit_after is None else exit_after)
    if not exits or list(exits) != sorted(set(exits)) or exits[-1] != num_blocks - 1 or exits[0] < 0:
        raise HetflError(f"exits of {name} must be increasing blocks in 0..{num_blocks - 1} ending with the "
                         f"last block {num_blocks - 1}, got {list(exits)}")
    return ModelFamily(name, tuple(input_shape), num_classes, ArchSpec(num_blocks, exits),
                       partial(entry.builder, exit_after=exits), width, norm, entry.channels)


__all__ = ["ArchSpec", "FAMILIES", "FamilyEntry", "ModelFamily", "MultiExitModel", "MODEL_NAMES", "NORMS",
           "model_family", "register_family"]
