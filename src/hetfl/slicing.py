"""Sub-model specs and the extract/scatter pair between global and local tensors (DESIGN.md).

Depth keeps a subset of parameter names; width keeps a window of every dimension that the
sub-model has smaller (output and input channels; image channels and the class dimension are
never smaller, so never sliced). Both reduce to one rule: local index i of a dimension of global
size G and local size s < G is global index (offset + i) mod G, where ``offset`` is the spec's
(``window``); a dimension the sub-model keeps whole (s = G) stays whole and in order. At offset
0 (every method but FedRolex) that is the leading corner ``global[:s0, :s1, ...]``, taken by plain
slicing (a view); a window that wraps is taken with index tensors. Every sliced dimension of one
spec shares the offset, so a layer's output window is the next layer's input window. Methods that
keep several models in one global state give a sub-model a ``group``: its names live under that
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
    offset: int = 0  # first global index of every sliced dimension's window; indices wrap modulo the dimension's
    # global size (FedRolex's rolling window); 0 = the leading corner

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
                   d.get("group", ""), tuple(d.get("shared", ())), int(d.get("level", 0)), tuple(d.get("bases", ())),
                   int(d.get("offset", 0)))  # specs serialised before offsets existed read as leading corners


def corner(shape: torch.Size | tuple[int, ...]) -> tuple[slice, ...]:
    """Index of the leading corner of the given shape."""
    return tuple(slice(0, s) for s in shape)


Index = tuple  # indexes a global tensor at a local tensor's elements: slices, or broadcasting index tensors


def window(global_shape: torch.Size | tuple[int, ...], local_shape: torch.Size | tuple[int, ...], offset: int = 0,
           device: torch.device | str | None = None) -> Index:
    """Index of the elements of a global tensor that a local tensor holds at ``offset``: in every dimension the local
    one has smaller, indices offset, offset + 1, ... modulo the global size; a whole dimension stays in order.

    Slices (so a view: the leading corner at offset 0, the fast path) unless a window wraps; then one index tensor
    per dimension (on ``device``), shaped to broadcast to ``local_shape`` (an open mesh).
    """
    if not offset:
        return corner(local_shape)
    starts = [offset % g if s < g else 0 for g, s in zip(global_shape, local_shape)]
    if all(a + s <= g for a, s, g in zip(starts, local_shape, global_shape)):
        return tuple(slice(a, a + s) for a, s in zip(starts, local_shape))
    n = len(local_shape)
    return tuple((torch.arange(a, a + s, device=device) % g).view([-1 if d == i else 1 for i in range(n)])
                 for d, (a, s, g) in enumerate(zip(starts, local_shape, global_shape)))


def is_view(idx: Index) -> bool:
    """Whether ``idx`` is plain slices (indexing gives a view, not a copy)."""
    return all(isinstance(i, slice) for i in idx)


def add_at(target: torch.Tensor, idx: Index, values: torch.Tensor | float, alpha: float = 1.0) -> None:
    """Returns None; adds ``alpha * values`` to ``target`` at ``idx`` (a ``window``), in place."""
    if is_view(idx):
        target[idx].add_(values, alpha=alpha)
    else:  # a window's indices are distinct, so read-add-write is exact
        target[idx] = target[idx].add_(values, alpha=alpha)


ROOT = SubModel(depth=0)  # names map to themselves


def extract(global_state: State, local_shapes: dict[str, torch.Size], spec: SubModel = ROOT) -> State:
    """Local tensors: for every local name, the window (``spec.offset``) of its global tensor (``spec.global_name``)."""
    if not spec.offset:  # the leading corner: plain slicing
        return {name: global_state[spec.global_name(name)][corner(shape)].clone()
                for name, shape in local_shapes.items()}
    out = {}
    for name, shape in local_shapes.items():
        tensor = global_state[spec.global_name(name)]
        idx = window(tensor.shape, shape, spec.offset, tensor.device)
        out[name] = tensor[idx].clone() if is_view(idx) else tensor[idx]  # index tensors already copy
    return out


def scatter(local_state: State, global_state: State, spec: SubModel = ROOT) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Global-shaped (values, mask) per global name the local state covers; values are 0 outside the mask."""
    out = {}
    for name, tensor in local_state.items():
        key = spec.global_name(name)
        ref = global_state[key]
        value = torch.zeros_like(ref)
        mask = torch.zeros(ref.shape, dtype=torch.bool, device=ref.device)
        idx = window(ref.shape, tensor.shape, spec.offset, ref.device)
        value[idx] = tensor
        mask[idx] = True
        out[key] = (value, mask)
    return out


def state_bytes(state: State) -> int:
    """Bytes a state occupies on the wire (its tensors' storage)."""
    return sum(t.numel() * t.element_size() for t in state.values())
