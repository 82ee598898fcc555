"""Secure aggregation's vector, which both sides build alike: the round's ``Layout`` (the server fixes it) and the
vector a client puts into the secure sum (``client_vector``; a node's reply to secure work, ``secure_reply``).

Client side: it imports nothing of the server's, so a SuperNode's ClientApp builds its vector without the methods or
the simulator (tests/test_layering.py). The server's half of secure aggregation is ``secure``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import RecordDict

from ..privacy.clipping import WITHIN_CLIP
from ..slicing import State, add_at
from ..task import Task
from ..updates import Update, check_update
from .secure_wire import LAYOUT, ROWS, vector_content
from .wire import Work

LOSS_SCALE = 64.0  # the loss travels divided by this, so losses up to 64 * clipping_range fit


@dataclass(frozen=True)
class Layout:
    """One round's flat vector: every global tensor's delta (in ``names`` order, each flattened), then the coverage
    mask of the ``masked`` ones (same order), then the adaptive-clipping bit and the loss / ``loss_scale``."""

    names: tuple[tuple[str, tuple[int, ...]], ...]
    masked: tuple[str, ...] = ()
    clip: float = 8.0
    loss_scale: float = LOSS_SCALE

    @classmethod
    def of(cls, global_state: State, masked=(), clip: float = 8.0) -> Layout:
        """The layout of ``global_state``'s tensors with masks for the names in ``masked``."""
        masked = set(masked)
        names = tuple((k, tuple(v.shape)) for k, v in global_state.items())
        return cls(names, tuple(k for k, _ in names if k in masked), float(clip))

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.names)

    @property
    def size(self) -> int:
        """Entries of the vector."""
        shapes = self.shapes
        return sum(math.prod(s) for s in shapes.values()) + sum(math.prod(shapes[k]) for k in self.masked) + 2

    def to_json(self) -> str:
        return json.dumps({"names": [[k, list(s)] for k, s in self.names], "masked": list(self.masked),
                           "clip": self.clip, "loss_scale": self.loss_scale})

    @classmethod
    def from_json(cls, text: str) -> Layout:
        d = json.loads(text)
        return cls(tuple((str(k), tuple(int(x) for x in s)) for k, s in d["names"]), tuple(d["masked"]),
                   float(d["clip"]), float(d["loss_scale"]))

    def flatten(self, deltas: State, masks: State, within: float = 0.0, loss: float = 0.0) -> np.ndarray:
        """The vector (float64) of global-shaped ``deltas`` and ``masks`` (a name missing: zeros)."""
        shapes, parts = self.shapes, []
        for source, names in ((deltas, [k for k, _ in self.names]), (masks, self.masked)):
            for k in names:
                t = source.get(k)
                parts.append(np.zeros(math.prod(shapes[k])) if t is None
                             else t.detach().to("cpu", torch.float64).reshape(-1).numpy())
        loss = loss / self.loss_scale if math.isfinite(loss) else self.clip  # a diverged loss shows as the largest
        parts.append(np.array([float(within), min(max(loss, -self.clip), self.clip)]))
        return np.concatenate(parts)

    def unflatten(self, vector: np.ndarray) -> tuple[State, State, float, float]:
        """(deltas, masks, within, loss) of a vector (or of a sum of vectors), as float64 tensors."""
        vector = np.asarray(vector, dtype=np.float64).reshape(-1)
        if vector.size != self.size:
            raise ValueError(f"the vector has {vector.size} entries, the round's layout {self.size}")
        shapes, at, out = self.shapes, 0, ({}, {})
        for target, names in zip(out, ([k for k, _ in self.names], self.masked)):
            for k in names:
                n = math.prod(shapes[k])
                target[k] = torch.from_numpy(vector[at:at + n].copy()).reshape(shapes[k])
                at += n
        return out[0], out[1], float(vector[at]), float(vector[at + 1]) * self.loss_scale


def client_vector(update: Update, task: Task, sent: State, layout: Layout, rows=()) -> np.ndarray:
    """The vector a client puts into the secure sum: its update minus ``sent`` (the tensors it received) at its
    window of the global shapes, the coverage masks ``layout`` asks for (label masking: only the classifier ``rows``
    of the classes it holds count, and only they carry its delta), its adaptive-clipping bit and its loss.
    ValueError when the update fails the checks the server makes of a plain update (``updates.check_update``), leaves
    out a tensor whose coverage the server counts itself, or moves an entry beyond the clipping range."""
    if (problem := check_update(update, task, sent)) is not None:
        raise ValueError(f"its update cannot go into the secure sum: {problem}")
    spec, shapes, masked = task.spec, layout.shapes, set(layout.masked)
    held = None
    num_classes = task.family.num_classes
    if rows and update.classes is not None and len(update.classes) < num_classes:
        held = torch.zeros(num_classes, dtype=torch.float64)
        held[list(update.classes)] = 1.0
    deltas: State = {}
    masks: State = {}
    for name, tensor in update.state.items():
        key = spec.global_name(name)
        if key not in shapes:
            raise ValueError(f"its tensor '{name}' ({key}) is not in the round's layout")
        delta = tensor.detach().to("cpu", torch.float64) - sent[name].detach().to("cpu", torch.float64)
        cover = torch.ones_like(delta)
        if held is not None and name in rows:
            if delta.dim() == 0 or delta.shape[0] != num_classes:
                raise ValueError(f"classifier tensor '{name}' has {tuple(delta.shape)} rows, not {num_classes}")
            cover = held.view(-1, *[1] * (delta.dim() - 1)).expand_as(delta)
            delta = delta * cover
            if key not in masked:
                raise ValueError(f"the round's layout has no mask for classifier tensor {key}")
        idx = spec.window(name, shapes[key], tuple(delta.shape))
        if key not in deltas:
            deltas[key] = torch.zeros(shapes[key], dtype=torch.float64)
        add_at(deltas[key], idx, delta)
        if key in masked:
            if key not in masks:
                masks[key] = torch.zeros(shapes[key], dtype=torch.float64)
            add_at(masks[key], idx, cover)
    for name in sent:
        if name not in update.state and spec.global_name(name) not in masked:
            raise ValueError(f"its update leaves out tensor '{name}', which the round's layout counts as held")
    vector = layout.flatten(deltas, masks, update.metrics.get(WITHIN_CLIP, 0.0),
                            float(update.metrics.get("train_loss", 0.0)))
    biggest = float(np.abs(vector).max()) if vector.size else 0.0
    if biggest > layout.clip:
        raise ValueError(f"an entry of its update moved by {biggest:.4g}, beyond secure aggregation's clipping range "
                         f"+-{layout.clip:g} (hetfl deploy --secure-clipping-range)")
    return vector


def secure_reply(update: Update, work: Work, config) -> RecordDict:
    """A node's reply to secure work (``node.NodeTrainer``): the vector of ``update`` (``client_vector``)."""
    layout = Layout.from_json(str(config[LAYOUT]))
    rows = json.loads(str(config[ROWS])) if ROWS in config else []
    return vector_content(client_vector(update, work.task, work.local, layout, rows))
