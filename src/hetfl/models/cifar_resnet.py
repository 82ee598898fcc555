"""CIFAR-style residual networks cut into residual blocks: ResNet-110 (He et al., 2016, Sec. 4.2) and
PreResNet-20 (He et al., 2016b), as ScaleFL and FeDepth use them.

* ResNet-110: 3x3 stem (16 channels), 3 stages x 18 BasicBlocks with 16/32/64 channels (strides
  1/2/2); shortcut = 1x1 conv + BN where the shape changes (option B). ScaleFL's exit head
  (as in the authors' code): 3 x [conv3x3 C->C, BN (batch statistics), ReLU], global average
  pool, Linear; the last exit is the network's own pool + Linear.
* PreResNet-20: 3x3 stem (16 channels), 9 pre-activation blocks (BN-ReLU-conv-BN-ReLU-conv) with
  channels 16,16,16,32,32,32,64,64,64; FeDepth's head (BN, ReLU, pool, Linear) after the last
  block and, by default, after each stage (blocks 3, 6, 9).

Every block is one unit of the depth cut; exits sit after the blocks in ``exit_after`` (0-based).
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import nn

from .base import MultiExitModel, norm2d, scaled
from .registry import FamilyEntry, register_family


class SubsampledPointwiseConv(nn.Conv2d):
    """A 1x1 convolution that takes its stride by subsampling its input, then convolves at stride 1: the same
    function, and the same bits wherever the strided kernel is right (checked here for 8-128 input channels).

    Why: oneDNN's AVX2 1x1 kernel, given a stride and a channels-last input with fewer channels than its block
    of 8, writes past its workspace in the backward pass (uxlfoundation/oneDNN#6035). Seen here with torch 2.13.0
    on an AVX2-only AMD EPYC, for the width-0.34 PreResNet-20's 6-channel shortcut: a heap corruption abort
    with one thread, weight gradients off by up to 200 with two. A unit-stride 1x1 convolution takes no such path.
    """

    def forward(self, x):
        sh, sw = self.stride
        return F.conv2d(x[:, :, ::sh, ::sw], self.weight, self.bias)


def shortcut(in_ch: int, out_ch: int, stride: int, norm: str) -> nn.Module:
    """Identity, or 1x1 conv + norm where the shape changes."""
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(SubsampledPointwiseConv(in_ch, out_ch, 1, stride, bias=False), norm2d(out_ch, norm))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut, then ReLU."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = norm2d(out_ch, norm)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = norm2d(out_ch, norm)
        self.shortcut = shortcut(in_ch, out_ch, stride, norm)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class PreActBlock(nn.Module):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3 + shortcut (pre-activation)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str):
        super().__init__()
        self.bn1 = norm2d(in_ch, norm)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn2 = norm2d(out_ch, norm)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.shortcut = shortcut(in_ch, out_ch, stride, norm)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.conv1(self.relu(self.bn1(x)))
        return self.conv2(self.relu(self.bn2(out))) + self.shortcut(x)


def conv_exit(channels: int, num_classes: int, norm: str) -> nn.Sequential:
    """ScaleFL's early-exit head: 3 x (conv3x3, BN, ReLU), global average pool, Linear."""
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Conv2d(channels, channels, 3, 1, 1), norm2d(channels, norm), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))


def pool_exit(channels: int, num_classes: int, norm: str, preact: bool) -> nn.Sequential:
    """Global average pool + Linear; preceded by BN-ReLU for pre-activation networks (FeDepth's head)."""
    head: list[nn.Module] = [norm2d(channels, norm), nn.ReLU(inplace=True)] if preact else []
    return nn.Sequential(*head, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))


CHANNELS = (16, 32, 64)  # the stem has the first stage's channels


def stage_channels(blocks_per_stage: int, widths=CHANNELS) -> list[tuple[int, int]]:
    """(channels, stride) of every block of a 3-stage CIFAR ResNet."""
    return [(c, 2 if s > 0 and i == 0 else 1) for s, c in enumerate(widths) for i in range(blocks_per_stage)]


def build_cifar_resnet(input_shape, num_classes, *, width, depth, norm, blocks_per_stage: int, preact: bool,
                       exit_after: tuple[int, ...]) -> MultiExitModel:
    """A CIFAR ResNet cut to ``depth`` blocks, exits after the blocks of ``exit_after`` below that depth."""
    layout = stage_channels(blocks_per_stage)
    depth = len(layout) if depth is None else depth
    stem_ch = scaled(CHANNELS[0], width)
    stem = nn.Sequential(nn.Conv2d(input_shape[0], stem_ch, 3, 1, 1, bias=False),
                         *([] if preact else [norm2d(stem_ch, norm), nn.ReLU(inplace=True)]))
    block_cls = PreActBlock if preact else BasicBlock
    blocks, in_ch = [], stem_ch
    for channels, stride in layout[:depth]:
        out_ch = scaled(channels, width)
        blocks.append(block_cls(in_ch, out_ch, stride, norm))
        in_ch = out_ch
    last = len(layout) - 1
    kept = tuple(b for b in exit_after if b < depth)
    exits = [pool_exit(scaled(layout[b][0], width), num_classes, norm, preact) if preact or b == last
             else conv_exit(scaled(layout[b][0], width), num_classes, norm) for b in kept]
    return MultiExitModel(stem, blocks, exits, kept)


# (blocks per stage, pre-activation, default exits = the end of each stage)
for _name, (_per_stage, _preact, _exits) in {"resnet110": (18, False, (17, 35, 53)),
                                             "preresnet20": (3, True, (2, 5, 8))}.items():
    register_family(_name, FamilyEntry(3 * _per_stage, _exits, CHANNELS,
                                       partial(build_cifar_resnet, blocks_per_stage=_per_stage, preact=_preact)))
