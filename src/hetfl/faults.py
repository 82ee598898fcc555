"""Fault injection for testing and study: clients that drop out, and updates corrupted in known ways.

The simulator picks, each round, a seeded fraction of the sampled clients that send nothing
(``dropout_fraction``) and a fraction whose update is corrupted (``corrupt_fraction``); a Flower
node corrupts every reply when its node config says ``corrupt=KIND``. Every corruption is one the
server must reject before aggregation (``updates.check_update``).
"""

from __future__ import annotations

import dataclasses
import math

from .updates import Update
from .seeding import rng_for
from .slicing import SubModel

# what a corrupted update gets wrong: a NaN or an inf value, a tensor's shape or dtype, the sub-model it
# claims to have trained (one the server did not assign), its sample count
CORRUPTIONS = ("nan", "inf", "shape", "dtype", "spec", "samples")


def pick(clients: list[int], fraction: float, seed: int, purpose: str, round_index: int) -> set[int]:
    """round(fraction x len(clients)) of ``clients`` (half up), drawn with a generator seeded by
    (seed, purpose, round)."""
    count = math.floor(fraction * len(clients) + 0.5)
    if count == 0:
        return set()
    rng = rng_for(seed, purpose, round_index)
    return {clients[i] for i in rng.choice(len(clients), count, replace=False)}


def corruption_for(seed: int, round_index: int, client: int) -> str:
    """The corruption a corrupted client applies this round, seeded by (seed, round, client)."""
    return CORRUPTIONS[int(rng_for(seed, "corruption", round_index, client).integers(len(CORRUPTIONS)))]


def corrupt(update: Update, kind: str) -> Update:
    """``update`` corrupted as ``kind`` (one of ``CORRUPTIONS``) says."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"corruption '{kind}' is unknown; one of {', '.join(CORRUPTIONS)}")
    if kind == "samples":
        return dataclasses.replace(update, num_samples=0)
    if kind == "spec":
        return dataclasses.replace(update, spec=SubModel(depth=update.spec.depth + 1, width=update.spec.width))
    state = dict(update.state)
    name = next(n for n, t in state.items() if t.is_floating_point() and t.dim() > 1)
    tensor = state[name].clone()
    if kind in ("nan", "inf"):
        tensor.view(-1)[0] = float(kind)
    elif kind == "shape":
        tensor = tensor[:-1]
    else:
        tensor = tensor.double()
    state[name] = tensor
    return dataclasses.replace(update, state=state)
