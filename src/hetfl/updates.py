"""Checks on client updates before they reach aggregation: one bad client must not poison the global model.

A dropped update is counted in the round log (``dropped``) and warned about once per client and run.
"""

from __future__ import annotations

import torch

from .errors import warn
from .slicing import State

_warned: set[tuple[str, int]] = set()  # (run folder, client) already warned about


def check_update(state: State, expected_shapes: dict[str, torch.Size]) -> str | None:
    """Why the update ``state`` cannot be aggregated (unknown tensor, wrong shape, non-finite values), or None."""
    for name, tensor in state.items():
        if name not in expected_shapes:
            return f"tensor '{name}' was not sent to the client"
        if not isinstance(tensor, torch.Tensor):
            return f"'{name}' is a {type(tensor).__name__}, not a tensor"
        if tuple(tensor.shape) != tuple(expected_shapes[name]):
            return f"tensor '{name}' has shape {tuple(tensor.shape)}, expected {tuple(expected_shapes[name])}"
    floats = {n: t for n, t in state.items() if t.is_floating_point()}
    if floats and not bool(torch.stack([torch.isfinite(t).all() for t in floats.values()]).all()):  # one sync
        name = next(n for n, t in floats.items() if not bool(torch.isfinite(t).all()))
        return f"tensor '{name}' holds non-finite values (NaN or inf)"
    return None


def warn_dropped(run: object, client: int, round_index: int, reason: str) -> None:
    """Returns None; warns that ``client``'s update was dropped, the first time per client and ``run``."""
    key = (str(run), client)
    if key in _warned:
        return
    _warned.add(key)
    warn(f"round {round_index}: dropped the update of client {client}: {reason} (warned once per client)")
