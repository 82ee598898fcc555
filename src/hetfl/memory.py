"""Training memory measured on a step's own tensors (client side; the cost model uses the same rule).

What one training step must keep alive: the tensors autograd saves for the backward pass
(recorded by saved-tensor hooks as the forward pass runs, each storage counted once, parameters
excluded) plus, for every trainable parameter, the parameter, its gradient and SGD's momentum
buffer. It is not the allocator's peak: transient tensors (those of a forward pass run without
autograd, or freed before the backward pass) are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

# parameter, gradient and momentum buffer: the buffer is counted whether or not momentum is on, so that a
# budget and what fits in it are measured by one rule (``costs.measure`` counts it by default too)
PARAMETER_COPIES = 3


class SavedTensors:
    """Within the block, ``bytes`` = the storage autograd saves for backward (each storage once, ``exclude``d
    tensors' storage, e.g. parameters, left out)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._excluded:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved so far."""
        return sum(self._seen.values())

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def parameter_bytes(params: Iterable[nn.Parameter]) -> int:
    """Bytes of the given parameters' storage."""
    return sum(p.numel() * p.element_size() for p in params)


def step_bytes(saved: int, trainable: int, copies: int = PARAMETER_COPIES) -> int:
    """Training memory of one step: ``saved`` activation bytes + ``copies`` x the trainable parameters' bytes."""
    return saved + copies * trainable
