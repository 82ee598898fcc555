"""The 4-conv CNN of HeteroFL (Diao et al., 2021) and DepthFL (Kim et al., 2023, MNIST setting).

Block i = Conv3x3 -> BatchNorm (batch statistics, no running buffers) -> ReLU [-> MaxPool2d(2)
for the first three blocks]; channels 64/128/256/512 at width 1 (about 1.56M parameters for
1x28x28 inputs; depth-1..4 models hold 1,418 / 76,820 / 375,070 / 1,561,384 with 10 classes).
HeteroFL's classifier (global average pool + Linear) is the last exit, and an exit of the same
shape follows every earlier block (family ``cnn``). DepthFL's own MNIST ConvNet (Table 1: 31.4K /
178K / 750K / 1.94M) has "bottleneck layers" in its exits (Sec. 3.1) whose exact shape the paper
does not give; family ``cnn-depthfl`` gives every exit but the last the bottleneck its authors use
on ResNets (``resnet.AttentionExit``: an attention map, then separable convs up to the last block's
channels, pool, Linear), so that a 1-block exit is not a bare linear read-out of 32-64 pooled
numbers. Its last exit is HeteroFL's, so width scaling cuts both families alike.

BatchNorm keeps no running statistics: that is what HeteroFL and ScaleFL do (a width slice of
running statistics has no meaning) and it leaves nothing but parameters to aggregate.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from .base import MultiExitModel, norm2d, scaled
from .registry import FamilyEntry, register_family
from .resnet import AttentionExit

CHANNELS = (64, 128, 256, 512)


def conv_block(in_ch: int, out_ch: int, pool: bool, norm: str) -> nn.Sequential:
    """Conv3x3 -> norm -> ReLU [-> MaxPool2d(2)]."""
    layers: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, 3, 1, 1), norm2d(out_ch, norm), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def pool_linear_exit(in_ch: int, num_classes: int) -> nn.Sequential:
    """Global average pool -> Linear: HeteroFL's classifier, used as every exit."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, num_classes))


def build_convnet(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    depth: int | None = None,
    norm: str = "bn",
    exit_after: tuple[int, ...] = tuple(range(len(CHANNELS))),
    bottleneck_exits: bool = False,
) -> MultiExitModel:
    """The CNN cut to ``depth`` blocks (default all 4) at channel ratio ``width``, exits after ``exit_after``
    (with DepthFL-style bottlenecks before every exit but the last one with ``bottleneck_exits``)."""
    depth = len(CHANNELS) if depth is None else depth
    channels = [scaled(c, width) for c in CHANNELS]
    blocks = []
    in_ch = input_shape[0]
    for i in range(depth):
        blocks.append(conv_block(in_ch, channels[i], pool=i < len(CHANNELS) - 1, norm=norm))
        in_ch = channels[i]
    kept = tuple(b for b in exit_after if b < depth)
    last = len(CHANNELS) - 1
    exits = [AttentionExit(channels[b], channels[last], num_classes, norm) if bottleneck_exits and b < last
             else pool_linear_exit(channels[b], num_classes) for b in kept]
    return MultiExitModel(nn.Identity(), blocks, exits, kept)


register_family("cnn", FamilyEntry(len(CHANNELS), tuple(range(len(CHANNELS))), CHANNELS, build_convnet))
register_family("cnn-depthfl", FamilyEntry(len(CHANNELS), tuple(range(len(CHANNELS))), CHANNELS,
                                           partial(build_convnet, bottleneck_exits=True)))
