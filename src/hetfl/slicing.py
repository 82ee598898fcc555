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

Dense connections (MSDNet, ``models.chunks``): a layer that reads the concatenation of earlier
layers' outputs has an input dimension made of chunks, and a width keeps the leading share of
every chunk. The spec's ``chunks`` names those dimensions with their width-1 chunk sizes; in such
a dimension the rule above applies to each chunk on its own (its local size is the family's
rounding of its width-1 size, ``chunk_sizes``), and the dimension's window is the union of the
chunks' windows, in chunk order. Every other dimension, and every other backbone (``chunks``
empty), is unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache

import torch

from .models.base import scaled

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
    chunks: tuple[tuple[str, int, tuple[int, ...]], ...] = ()  # (local name, dimension, width-1 chunk sizes) of the
    # dimensions that concatenate chunks (dense connections: ``ModelFamily.chunks``); () = none

    def global_name(self, name: str) -> str:
        """The global-state name of this sub-model's local tensor ``name``."""
        if not self.group or (self.shared and name.startswith(self.shared)):
            return name
        return self.group + name

    @cached_property
    def _chunks_by_name(self) -> dict[str, dict[int, tuple[int, ...]]]:
        by_name: dict[str, dict[int, tuple[int, ...]]] = {}
        for name, dim, sizes in self.chunks:
            by_name.setdefault(name, {})[dim] = sizes
        return by_name

    def window(self, name: str, global_shape: torch.Size | tuple[int, ...], local_shape: torch.Size | tuple[int, ...],
               device: torch.device | str | None = None) -> Index:
        """Index of the elements of the global tensor that local tensor ``name`` holds: ``slicing.window`` at this
        spec's offset, chunk by chunk in the dimensions ``chunks`` names for ``name``."""
        return window(global_shape, local_shape, self.offset, device, self._chunks_by_name.get(name))

    def to_dict(self) -> dict:
        """A JSON-serialisable form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SubModel:
        """The spec serialised by ``to_dict``."""
        exits = d.get("exits")
        chunks = tuple((str(name), int(dim), tuple(int(c) for c in sizes)) for name, dim, sizes in d.get("chunks", ()))
        return cls(int(d["depth"]), float(d.get("width", 1.0)), None if exits is None else tuple(exits),
                   d.get("group", ""), tuple(d.get("shared", ())), int(d.get("level", 0)), tuple(d.get("bases", ())),
                   int(d.get("offset", 0)), chunks)  # specs serialised before offsets existed read as leading corners


def corner(shape: torch.Size | tuple[int, ...]) -> tuple[slice, ...]:
    """Index of the leading corner of the given shape."""
    return tuple(slice(0, s) for s in shape)


Index = tuple  # indexes a global tensor at a local tensor's elements: slices, or broadcasting index tensors


def window(global_shape: torch.Size | tuple[int, ...], local_shape: torch.Size | tuple[int, ...], offset: int = 0,
           device: torch.device | str | None = None, chunks: dict[int, tuple[int, ...]] | None = None) -> Index:
    """Index of the elements of a global tensor that a local tensor holds at ``offset``: in every dimension the local
    one has smaller, indices offset, offset + 1, ... modulo the global size; a whole dimension stays in order. A
    dimension ``chunks`` maps to width-1 chunk sizes takes that rule in each chunk, the chunks' windows in order.

    Slices (so a view: the leading corner at offset 0, the fast path) unless a window wraps or skips; then one index
    tensor per dimension (on ``device``), shaped to broadcast to ``local_shape`` (an open mesh).
    """
    if not offset and not chunks:
        return corner(local_shape)
    picks = [_chunked_picks(g, s, offset, chunks[d]) if chunks and d in chunks and s < g else _picks(g, s, offset)
             for d, (g, s) in enumerate(zip(global_shape, local_shape))]
    if all(isinstance(p, slice) for p in picks):
        return tuple(picks)
    n = len(local_shape)
    return tuple((torch.arange(p.start, p.stop, device=device) if isinstance(p, slice) else p.to(device))
                 .view([-1 if d == i else 1 for i in range(n)]) for d, p in enumerate(picks))


def _picks(g: int, s: int, offset: int) -> slice | torch.Tensor:
    """The global indices a dimension of local size ``s`` holds of global size ``g``: a slice, or indices that wrap."""
    a = offset % g if s < g else 0
    return slice(a, a + s) if a + s <= g else torch.arange(a, a + s) % g


@lru_cache(maxsize=4096)
def _chunked_picks(g: int, s: int, offset: int, units: tuple[int, ...]) -> torch.Tensor:
    """The global indices a chunked dimension of local size ``s`` holds of global size ``g``: each chunk's window
    (cached: the same few dimensions are cut for every client and round; callers only read it)."""
    starts, picks = 0, []
    for whole, held in zip(chunk_sizes(units, g), chunk_sizes(units, s)):
        held_here = torch.arange(whole) if held == whole else (offset + torch.arange(held)) % whole
        picks.append(starts + held_here)
        starts += whole
    return torch.cat(picks)


@lru_cache(maxsize=4096)
def chunk_sizes(units: tuple[int, ...], total: int) -> tuple[int, ...]:
    """The sizes of chunks of width-1 sizes ``units`` in a dimension of ``total`` channels: the family's rounding
    (``models.base.scaled``) of every unit at one width. Each size grows with the width, so the total fixes them all.

    Every size is constant between consecutive break points k / u of the widths, so searching the break points
    finds the one width class whose sizes add up to ``total``; ValueError if none does.
    """
    top = max(units)  # the largest chunk alone holds at most total channels: no width beyond total / top matters
    breaks = sorted({k / u for u in units for k in range(1, u * total // top + 2)})
    lo, hi = 0, len(breaks)
    while lo < hi:  # the first break point whose sizes add up to total or more
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if sum(scaled(u, breaks[mid]) for u in units) < total else (lo, mid)
    sizes = tuple(scaled(u, breaks[lo]) for u in units) if lo < len(breaks) else ()
    if sum(sizes) != total:
        raise ValueError(f"{total} channels are no width of chunks {units}")
    return sizes


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
    """Local tensors: for every local name, the window (``SubModel.window``: its offset and chunks) of its global tensor
    (``spec.global_name``)."""
    if not spec.offset and not spec.chunks:  # the leading corner: plain slicing
        return {name: global_state[spec.global_name(name)][corner(shape)].clone()
                for name, shape in local_shapes.items()}
    out = {}
    for name, shape in local_shapes.items():
        tensor = global_state[spec.global_name(name)]
        idx = spec.window(name, tensor.shape, shape, tensor.device)
        out[name] = tensor[idx].clone() if is_view(idx) else tensor[idx]  # index tensors already copy
    return out


def narrowed(params: State, shapes: dict[str, torch.Size], spec: SubModel) -> State:
    """The tensors of ``spec``'s narrower model taken from a wider model's ``params`` (its leading slices, chunk by chunk
    in dense layers): a width nested in another (SHeteroFL, FjORD) reads these views or copies of the same tensors."""
    return {n: params[n][spec.window(n, params[n].shape, shape, params[n].device)]
            for n, shape in shapes.items() if n in params}


def scatter(local_state: State, global_state: State, spec: SubModel = ROOT) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Global-shaped (values, mask) per global name the local state covers; values are 0 outside the mask."""
    out = {}
    for name, tensor in local_state.items():
        key = spec.global_name(name)
        ref = global_state[key]
        value = torch.zeros_like(ref)
        mask = torch.zeros(ref.shape, dtype=torch.bool, device=ref.device)
        idx = spec.window(name, ref.shape, tensor.shape, ref.device)
        value[idx] = tensor
        mask[idx] = True
        out[key] = (value, mask)
    return out


def state_bytes(state: State) -> int:
    """Bytes a state occupies on the wire (its tensors' storage)."""
    return sum(t.numel() * t.element_size() for t in state.values())
