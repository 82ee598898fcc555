"""What a client sends back (``Update``), and the checks on it before it reaches aggregation: one bad client must
not poison the global model.

The same check runs in every engine (the simulator, Flower's ServerApp). A rejected update is
counted in the round log (``dropped``, and ``rejected``: client -> reason) and warned about once
per client and run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import warn
from .slicing import State, SubModel
from .task import Task


@dataclass
class Update:
    """What a client sends back: tensors in local shape, its spec, its sample count and metrics; with label masking,
    the classes it holds samples of (``methods.options.LabelMask``), else None."""

    client: int
    spec: SubModel
    state: State
    num_samples: int
    metrics: dict = field(default_factory=dict)
    classes: tuple[int, ...] | None = None


_warned: set[tuple[str, int]] = set()  # (run folder, client) already warned about


def check_update(update: Update, task: Task, sent: State) -> str | None:
    """Why ``update``, the reply to ``task`` whose tensors were ``sent``, cannot be aggregated (another
    client's, a sub-model that was not assigned, a sample count <= 0, an unknown tensor, a wrong shape or
    dtype, non-finite values), or None. A client may send back part of what it got."""
    if update.client != task.client:
        return f"the update says it is client {update.client}'s, but the task was client {task.client}'s"
    if update.spec != task.spec:
        return f"sub-model {update.spec} was not assigned (the task's is {task.spec})"
    if isinstance(update.num_samples, bool) or not isinstance(update.num_samples, int) or update.num_samples <= 0:
        return f"sample count {update.num_samples!r} is not an integer > 0"
    if (problem := _classes_problem(update.classes, task)) is not None:
        return problem
    for name, tensor in update.state.items():
        if name not in sent:
            return f"tensor '{name}' was not sent to the client"
        if not isinstance(tensor, torch.Tensor):
            return f"'{name}' is a {type(tensor).__name__}, not a tensor"
        if tuple(tensor.shape) != tuple(sent[name].shape):
            return f"tensor '{name}' has shape {tuple(tensor.shape)}, expected {tuple(sent[name].shape)}"
        if tensor.dtype != sent[name].dtype:
            return f"tensor '{name}' has dtype {tensor.dtype}, expected {sent[name].dtype}"
    floats = {n: t for n, t in update.state.items() if t.is_floating_point()}
    if floats and not bool(torch.stack([torch.isfinite(t).all() for t in floats.values()]).all()):  # one sync
        name = next(n for n, t in floats.items() if not bool(torch.isfinite(t).all()))
        return f"tensor '{name}' holds non-finite values (NaN or inf)"
    return None


def _classes_problem(classes, task: Task) -> str | None:
    """Why the classes an update says its client holds cannot be used (they must be sent exactly when the task masks
    labels: distinct class indices, at least one), or None."""
    if not task.train.label_mask:
        return None if classes is None else "it names its classes, but the task masks no labels"
    num_classes = task.family.num_classes
    if not isinstance(classes, tuple) or not classes or len(set(classes)) != len(classes) or not all(
            type(c) is int and 0 <= c < num_classes for c in classes):
        return f"its classes {classes!r} are not distinct class indices in [0, {num_classes})"
    return None


def warn_dropped(run: object, client: int, round_index: int, reason: str) -> None:
    """Returns None; warns that ``client``'s update was dropped, the first time per client and ``run``."""
    key = (str(run), client)
    if key in _warned:
        return
    _warned.add(key)
    warn(f"round {round_index}: dropped the update of client {client}: {reason} (warned once per client)")
