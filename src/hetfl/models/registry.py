"""The model-family registry: each backbone module registers itself here (like the methods' registry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyEntry:
    """How to build a registered backbone: its blocks, default exits, width-scaled sizes and builder."""

    num_blocks: int
    default_exits: tuple[int, ...]  # 0-based blocks an exit reads by default (the last block included)
    channels: tuple[int, ...]  # what a width ratio scales at width 1 (channels, or the ViT's heads)
    builder: Callable  # builder(input_shape, num_classes, *, width, depth, norm, exit_after) -> MultiExitModel


FAMILIES: dict[str, FamilyEntry] = {}


def register_family(name: str, entry: FamilyEntry) -> None:
    """Make the backbone ``name`` available to ``model_family`` (and so to ``--model``)."""
    if name in FAMILIES:
        raise ValueError(f"model family '{name}' is registered twice")
    FAMILIES[name] = entry
