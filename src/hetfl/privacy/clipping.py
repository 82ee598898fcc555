"""The client's part of DP-FedAvg: its update clipped to L2 norm C before it leaves (``privacy``, step 1).

Client side only (as ``client``): it imports nothing of the server's, so every executor and a Flower ClientApp
clip the same way.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..slicing import State
from ..task import Task
from ..updates import Update

WITHIN_CLIP = "dp_within_clip"  # the metric of adaptive clipping's bit: 1.0 if the update's norm was <= C, else 0.0


def update_norm(state: State, sent: State) -> torch.Tensor:
    """The L2 norm of the update (``state`` minus the ``sent`` tensors) over every floating-point tensor, in float64
    (a 0-d tensor)."""
    squares = [(t.double() - sent[n].double()).square().sum() for n, t in state.items() if t.is_floating_point()]
    return torch.stack(squares).sum().sqrt() if squares else torch.zeros((), dtype=torch.float64)


def clip_update(update: Update, sent: State, clip: float) -> Update:
    """``update`` with its difference from ``sent`` scaled to L2 norm at most ``clip`` (McMahan et al. 2018, Alg. 1
    ClipFn), over everything it sends, and adaptive clipping's bit in its metrics (Andrew et al. 2021, Alg. 1: the
    norm before clipping within ``clip``). An update within the norm is returned bit for bit."""
    norm = float(update_norm(update.state, sent))
    within = norm <= clip
    state = update.state
    if not within:
        scale = clip / norm
        state = {n: sent[n] + (t - sent[n]) * scale if t.is_floating_point() else t for n, t in state.items()}
    return replace(update, state=state, metrics={**update.metrics, WITHIN_CLIP: float(within)})


def privatized(update: Update, sent: State, task: Task) -> Update:
    """``update`` clipped as ``task`` says (``Task.dp_clip``; 0: no differential privacy, returned as is)."""
    return clip_update(update, sent, task.dp_clip) if task.dp_clip else update
