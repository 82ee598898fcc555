"""Channel chunks of dense connections: what a width slice keeps of a layer that reads a concatenation.

A dense layer (DenseNet, MSDNet) reads the concatenation of earlier layers' outputs, each a chunk
of channels. A width-r model keeps the leading share of every chunk (each earlier layer's leading
channels), so the input channels it keeps are a union of leading slices of the chunks, not the
leading corner of the concatenation (``slicing.SubModel.chunks``). A builder marks such a layer
with ``mark_chunks``; ``channel_chunks`` lists the marks, which ``ModelFamily.chunks`` reads off
the width-1 model.
"""

from __future__ import annotations

from torch import nn

Chunks = tuple[tuple[str, int, tuple[int, ...]], ...]  # (parameter name, dimension, chunk sizes along it)


def mark_chunks(conv: nn.Conv2d, sizes: list[int] | tuple[int, ...]) -> nn.Conv2d:
    """``conv``, recorded as reading the concatenation of chunks of ``sizes`` input channels, in order."""
    if sum(sizes) != conv.in_channels:
        raise ValueError(f"chunks {tuple(sizes)} do not add up to the {conv.in_channels} input channels")
    conv.in_chunks = tuple(sizes)
    return conv


def channel_chunks(model: nn.Module) -> Chunks:
    """(weight name, 1, chunk sizes) of every marked convolution of ``model`` that reads more than one chunk."""
    return tuple((f"{name}.weight", 1, module.in_chunks) for name, module in model.named_modules()
                 if len(getattr(module, "in_chunks", ())) > 1)
