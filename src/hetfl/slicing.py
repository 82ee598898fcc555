"""Sub-model specs and the extract/scatter pair between global and local tensors (DESIGN.md).

Depth keeps a subset of parameter names; width keeps the leading slice of every dimension that
the sub-model has smaller (output and input channels; image channels and the class dimension
are never smaller, so never sliced). Both reduce to one rule: a local tensor is the leading
corner ``global[:s0, :s1, ...]`` of the global tensor with the same name. Methods that keep
several models in one global state give a sub-model a ``group``: its names live under that
prefix in the global state, except those starting with one of its ``shared`` prefixes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

State = dict[str, torch.Tensor]
SCALINGS = ("depth", "width", "2d")  # how a level's sub-model is cut: its first blocks, leading channels, or both
TRAIN_EXITS = ("all", "last")  # which exits of a sub-model it holds and trains


@dataclass(frozen=True)
class SubModel:
    """Which part of the global model a client trains: depth, width ratio, trained exits, name group."""

    depth: int
    width: float = 1.0
    exits: tuple[int, ...] | None = None  # 1-based exits the sub-model holds (and trains); None = all of its depth
    group: str = ""  # prefix of this sub-model's own names in the global state ("" = the one shared model)
    shared: tuple[str, ...] = ()  # name prefixes that stay unprefixed: shared with every group
    level: int = 0  # the device level whose own model this is, for methods that keep one per level (0 = none)
    bases: tuple[int, ...] = ()  # SplitMix: the base networks held (each a full model at ``width``), () = not split

    def global_name(self, name: str) -> str:
        """The global-state name of this sub-model's local tensor ``name``."""
        if not self.group or (self.shared and name.startswith(self.shared)):
            return name
        return self.group + name

    def to_dict(self) -> dict:
        """A JSON-serialisable form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SubModel:
        """The spec serialised by ``to_dict``."""
        exits = d.get("exits")
        return cls(int(d["depth"]), float(d.get("width", 1.0)), None if exits is None else tuple(exits),
                   d.get("group", ""), tuple(d.get("shared", ())), int(d.get("level", 0)), tuple(d.get("bases", ())))


def corner(shape: torch.Size | tuple[int, ...]) -> tuple[slice, ...]:
    """Index of the leading corner of the given shape."""
    return tuple(slice(0, s) for s in shape)


ROOT = SubModel(depth=0)  # names map to themselves


def extract(global_state: State, local_shapes: dict[str, torch.Size], spec: SubModel = ROOT) -> State:
    """Local tensors: for every local name, the leading corner of its global tensor (``spec.global_name``)."""
    return {name: global_state[spec.global_name(name)][corner(shape)].clone() for name, shape in local_shapes.items()}


def scatter(local_state: State, global_state: State, spec: SubModel = ROOT) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Global-shaped (values, mask) per global name the local state covers; values are 0 outside the mask."""
    out = {}
    for name, tensor in local_state.items():
        key = spec.global_name(name)
        ref = global_state[key]
        value = torch.zeros_like(ref)
        mask = torch.zeros(ref.shape, dtype=torch.bool, device=ref.device)
        idx = corner(tensor.shape)
        value[idx] = tensor
        mask[idx] = True
        out[key] = (value, mask)
    return out


def state_bytes(state: State) -> int:
    """Bytes a state occupies on the wire (its tensors' storage)."""
    return sum(t.numel() * t.element_size() for t in state.values())
