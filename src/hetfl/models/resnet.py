"""ResNet-18 and ResNet-34 with DepthFL's exits (Kim et al., ICLR 2023, Sec. 3.1, Table 1).

CIFAR-style backbone: 3x3 stem (stride 1, no max-pool), BasicBlock stages [2,2,2,2] (ResNet-18)
or [3,4,6,3] (ResNet-34) with 64/128/256/512 channels and strides 1/2/2/2; the four stages are the
four blocks of the depth cut.

DepthFL's exits ("bottleneck layers"; the DepthFL Flower baseline follows "Be Your Own Teacher",
Zhang et al. 2019): exit i < 4 weighs stage i's features by an attention map
(SepConv(C, C) -> BN -> ReLU -> 2x upsample -> sigmoid), then a chain of SepConvs that double
the channels and halve the resolution up to 512 channels, global average pooling and
Linear(512, classes); the last exit is pool + Linear. A SepConv is depthwise 3x3 (stride 2) ->
1x1 -> BN -> ReLU -> depthwise 3x3 -> 1x1 -> BN -> ReLU. With these, the depth-1..4 models for
CIFAR-100 hold 479,652 / 1,347,336 / 3,838,316 / 12,283,344 parameters, Table 1's
480K / 1.35M / 3.84M / 12.3M.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import nn

from .base import MultiExitModel, norm2d, scaled
from .registry import FamilyEntry, register_family
from .cifar_resnet import BasicBlock

STAGES = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}
CHANNELS = (64, 128, 256, 512)


class SepConv(nn.Module):
    """Depthwise-separable conv pair: dw3x3 (stride) -> 1x1 -> BN -> ReLU -> dw3x3 -> 1x1 -> BN -> ReLU."""

    def __init__(self, in_ch: int, out_ch: int, norm: str, stride: int = 2):
        super().__init__()
        self.op = nn.Sequential(
            nn.Conv2d(in_ch, in_ch, 3, stride, 1, groups=in_ch, bias=False), nn.Conv2d(in_ch, in_ch, 1, bias=False),
            norm2d(in_ch, norm), nn.ReLU(inplace=False),
            nn.Conv2d(in_ch, in_ch, 3, 1, 1, groups=in_ch, bias=False), nn.Conv2d(in_ch, out_ch, 1, bias=False),
            norm2d(out_ch, norm), nn.ReLU(inplace=False))

    def forward(self, x):
        return self.op(x)


class AttentionExit(nn.Module):
    """DepthFL/BYOT exit: x * sigmoid(up(ReLU(BN(SepConv(x))))), SepConvs up to 512 channels, pool, Linear."""

    def __init__(self, channels: int, top: int, num_classes: int, norm: str):
        super().__init__()
        self.attention = nn.Sequential(SepConv(channels, channels, norm), norm2d(channels, norm), nn.ReLU())
        chain, c = [], channels
        while c < top:
            chain.append(SepConv(c, min(2 * c, top), norm))
            c = min(2 * c, top)
        self.scala = nn.Sequential(*chain, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(top, num_classes)

    def forward(self, x):
        attention = F.interpolate(self.attention(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.fc(self.scala(x * attention.sigmoid()))


def build_resnet(input_shape, num_classes, *, width, depth, norm, name: str = "resnet18",
                 exit_after: tuple[int, ...] = (0, 1, 2, 3)) -> MultiExitModel:
    """ResNet-18/34 cut to ``depth`` stages, an exit after the stages of ``exit_after`` (default each)."""
    depth = 4 if depth is None else depth
    channels = [scaled(c, width) for c in CHANNELS]
    stem = nn.Sequential(nn.Conv2d(input_shape[0], channels[0], 3, 1, 1, bias=False), norm2d(channels[0], norm),
                         nn.ReLU(inplace=True))
    blocks, exits, in_ch = [], [], channels[0]
    for stage in range(depth):
        layers = []
        for i in range(STAGES[name][stage]):
            layers.append(BasicBlock(in_ch, channels[stage], 2 if stage > 0 and i == 0 else 1, norm))
            in_ch = channels[stage]
        blocks.append(nn.Sequential(*layers))
        if stage not in exit_after:
            continue
        if stage < 3:
            exits.append(AttentionExit(channels[stage], channels[-1], num_classes, norm))
        else:
            exits.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels[-1], num_classes)))
    return MultiExitModel(stem, blocks, exits, tuple(b for b in exit_after if b < depth))


for _name in STAGES:
    register_family(_name, FamilyEntry(4, (0, 1, 2, 3), CHANNELS, partial(build_resnet, name=_name)))
