"""The exit summaries of a frozen pretrained backbone, computed once per document and read back.

With ``finetune = frozen`` nothing before an exit trains (ReeFL Sec. 4.1.3's "frozen" row): the
summary an exit reads after block b (``MeanExit.pool``: the token mean) is a fixed function of the
document and of the pretrained weights at the model's width. A method that does not act between
blocks (ExclusiveFL, DepthFL, InclusiveFL, ScaleFL, ReeFL without modulation) then spends nearly
all its time recomputing the same summaries: every round for the clients' documents, every
evaluation for the test set. ``FrozenFeatures`` computes them once for the documents a simulation
registers (its training and test sets) and a model whose backbone is frozen reads them instead of
running its blocks (``MultiExitModel.forward``, ``ReeModel.forward``).

Choices, and why:

* The summaries are computed for every registered document at once (a simulation asks with its
  deepest evaluation model first, ``prepare``), in dataset order and chunks of ``CHUNK`` rows, so
  a value never depends on which batch first asked for it: a run is deterministic and a resumed
  run reads the same numbers. They equal the backbone's own up to float rounding (a matrix product
  may round differently at another batch size), so a run with the store need not be bit-identical
  to one without; the option is off by default and recorded in the config
  (``cache_frozen_features``), so the two never share a run folder. Measured on R8 (DepthFL and
  ScaleFL, frozen, 40 rounds): the same curves and final accuracies, in under half the time.
* A model reads them only when its stem and blocks hold no trainable tensor (LoRA, adapters and
  SSF train inside the blocks) and no hook acts between blocks; the key is where the weights came
  from (the pretrained folder), the width and the read-out, so a width-sliced ScaleFL level reads
  its own summaries. A batch holding a document that was not registered runs the backbone.
* Documents are found by their token ids (a dictionary of row bytes), so nothing else of the
  engine (client data, evaluation, methods' losses) changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

CHUNK = 256  # documents per forward pass while filling (memory: CHUNK x tokens x hidden floats per layer)


class FrozenKey(NamedTuple):
    """What a frozen backbone's summaries depend on: the weights it was built from, its width, its read-out."""

    weights: str  # the pretrained folder
    width: float
    read_out: type  # an exit class whose static ``pool(h, mask)`` is the summary (models.minilm.MeanExit)


class FrozenFeatures:
    """Exit summaries of registered documents, per backbone key and block, filled on first request."""

    def __init__(self, documents: torch.Tensor):
        self.documents = documents  # (N, L) token ids
        self.row_of: dict[bytes, int] = {}
        for i, row in enumerate(self.documents.cpu().numpy()):
            self.row_of.setdefault(row.tobytes(), i)  # a repeated document reads its first copy's summaries
        self.summaries: dict[tuple[FrozenKey, int], torch.Tensor] = {}  # (backbone key, block) -> (N, D)
        self.fills = 0  # passes over the documents (tests check that a second request does not refill)

    def rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """The registered row of every document of ``x``, or None if one is not registered."""
        with torch._C._DisableFuncTorch():  # the token ids' bytes, also inside the trainer's grad transform
            found = [self.row_of.get(row.tobytes()) for row in x.cpu().numpy()]
        if any(i is None for i in found):
            return None
        return torch.tensor(found, device=self.documents.device)

    @torch.no_grad()
    def fill(self, model, key: FrozenKey, deepest: int) -> None:
        """Compute the summaries after blocks 0..``deepest`` of every document with ``model``'s backbone.

        Each chunk's summaries are copied into tensors allocated at the first chunk: kept as a list of
        small tensors, they pinned the heap between the chunks' large temporaries, and the resident memory
        grew by about 120 MB per chunk (4.9 GB for R8) instead of staying under 1 GB.
        """
        filled: dict[int, torch.Tensor] = {}
        for start in range(0, len(self.documents), CHUNK):
            chunk = self.documents[start:start + CHUNK]
            mask = model.token_mask(chunk)
            for b, h in model.hidden(chunk):  # the blocks as the model runs them, no hook between
                z = key.read_out.pool(h, mask)
                if b not in filled:
                    filled[b] = z.new_empty(len(self.documents), z.shape[1])
                filled[b][start:start + len(chunk)] = z
                if b == deepest:
                    break
        self.summaries.update({(key, b): z for b, z in filled.items()})
        self.fills += 1

    def prepare(self, models) -> None:
        """Fill the store with the deepest of ``models`` first (a simulation's evaluation models), so that a
        shallower client model asking first does not fill it only to have a deeper one fill it again."""
        for model in sorted((m for m in models if getattr(m, "frozen_key", None)), key=lambda m: -m.depth):
            self.read(model, self.documents[:1], range(model.depth))

    def read(self, model, x: torch.Tensor, blocks) -> dict[int, torch.Tensor] | None:
        """{block: (B, D) summaries of ``x`` after it} for ``blocks``, or None where they cannot be read."""
        key = model.frozen_key
        if key is None or any(p.requires_grad for part in (model.stem, model.blocks) for p in part.parameters()):
            return None
        rows = self.rows(x)
        if rows is None:
            return None
        deepest = max(blocks, default=-1)
        if any((key, b) not in self.summaries for b in blocks):
            self.fill(model, key, deepest)
        return {b: self.summaries[key, b][rows] for b in blocks}


_serving: FrozenFeatures | None = None
_last: FrozenFeatures | None = None


def features_of(*documents: torch.Tensor) -> FrozenFeatures:
    """The summaries store of these documents: the last one made if it holds the same documents (the runs of a
    bench process share it, so each backbone key is filled once per process), else a new one."""
    global _last
    joined = torch.cat(documents)
    last = _last
    if last is None or last.documents.shape != joined.shape or last.documents.device != joined.device \
            or not torch.equal(last.documents, joined):
        _last = FrozenFeatures(joined)
    return _last


@contextmanager
def serving(features: FrozenFeatures | None) -> Iterator[None]:
    """Frozen models read their exit summaries from ``features`` inside the block (None: they run their blocks)."""
    global _serving
    before, _serving = _serving, features
    try:
        yield
    finally:
        _serving = before


def is_serving() -> bool:
    """Whether frozen models read their summaries from a store now (looked up by the documents' bytes, so not
    under ``torch.func.vmap``)."""
    return _serving is not None


def frozen_summaries(model: nn.Module, x: torch.Tensor, blocks) -> dict[int, torch.Tensor] | None:
    """The summaries ``model`` would read after ``blocks`` for ``x``, from the features being served, or None."""
    return None if _serving is None else _serving.read(model, x, tuple(blocks))
