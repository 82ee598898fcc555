"""MSDNet-24 (Huang et al., "Multi-Scale Dense Networks for Resource Efficient Image Classification", ICLR 2018), the
multi-exit CNN ScaleFL runs beside ResNet-110 (Ilhan et al., CVPR 2023, Sec. 4.3, Table 3, Figure 2).

ScaleFL: "the recommended configuration with 24 layers, 3 scales and 16 initial hidden dimensions with a growth rate
of 6". The rest is Huang et al.'s CIFAR network as their PyTorch code builds it (kalviny/MSDNet-PyTorch,
``models/msdnet.py``; the ScaleFL authors' ``models/msdnet.py`` and ``config.py`` build the same one):

* Stem (MSDNet's first layer): conv3x3-BN-ReLU to 16 channels at the input's resolution (stride 1: CIFAR's setup),
  then a strided conv3x3-BN-ReLU to each coarser scale: 16 / 32 / 64 channels at 1, 1/2, 1/4 of the resolution
  (growth factors 1, 2, 4).
* 24 MSDNet layers, each one hetfl block (the unit of the depth cut). At every scale it keeps alive, a layer appends
  new channels to the concatenation of everything before it (dense connectivity): at the finest kept scale
  conv(same scale), 6 x factor channels; at every coarser scale conv(same scale) and a strided conv(finer scale),
  3 x factor channels each. Every conv is a bottleneck: conv1x1-BN-ReLU to min(C_in, bottleneck factor x its
  output) channels, then conv3x3-BN-ReLU (bottleneck factors 1, 2, 4).
* Scales are dropped as the network deepens ("prune max"): with an interval of ceil(24 / 3) = 8 layers, layers 1-8
  keep 3 scales, 9-16 two, 17-24 the coarsest only; the layer that drops a scale (9 and 17) ends with a transition,
  conv1x1-BN-ReLU per kept scale to floor(0.5 x C) channels (reduction 0.5).
* Exit classifiers read the coarsest scale: two conv3x3-BN-ReLU of stride 2 to 128 channels, global average pool,
  Linear. Huang pools with a 2x2 window (the 2x2 map CIFAR leaves); hetfl pools globally as the ScaleFL authors do,
  which is the same on 32x32 inputs and also reads smaller ones.
* Default exits after layers 6, 12, 18 and 24: the ScaleFL authors' ``msdnet24_4`` configuration (4 blocks, base 6,
  step 6, "even"); ScaleFL's own runs (``scaling = 2d``) place the exits where Eq. (1) cuts, after any layer.
* BatchNorm with batch statistics (``norm2d``), convolutions without bias, Huang's initialisation (He normal over
  the output fan, BN weight 1 and bias 0, Linear bias 0).

Width (HeteroFL's rule, ScaleFL Sec. 3.1.2): every channel count is ceil(r x its width-1 count): the stem's 16/32/64,
each layer's growth chunks, bottlenecks, transitions and the classifiers' 128. A dense layer's input is the
concatenation of such chunks, so a width-r model holds the leading share of every chunk (``models.chunks``,
``slicing.SubModel.chunks``), which is also what the ScaleFL authors' index search finds for its sub-models (its
``utils/grad_traceback.py`` marks the weights that the sub-model's channels reach). The ScaleFL authors scale only
the initial channels and the growth rate, with floor, and derive the rest; hetfl rounds every count up, as it does
for every backbone, so that a width's channels are its own.

Where the papers are silent:

* Small inputs: the stem's scale strides stay 1, 2, 2 (CIFAR's), so Fashion-MNIST's 28x28 runs at 28/14/7 and the
  digits' 8x8 at 8/4/2; the exits' strided convs pad, so any input of 2x2 or more reaches a 1x1 map before pooling.
* The ScaleFL authors' README runs MSDNet with ``--ee_locs 15 18 21``, which their class reads as the layers that
  end its blocks: a 21-layer network with three exits. hetfl keeps the 24 layers the paper names.

Costs (``hetfl costs --model msdnet24``, measured): on CIFAR-10 images at width 1 with the default exits, 2,503,708
parameters and 99.09M MACs per sample through all four exits (2,550,148 parameters for CIFAR-100); on Fashion-MNIST
2,503,420 and 80.26M. Neither paper states MSDNet's CIFAR size as a number (ScaleFL's Table 1 is ResNet-110's; Huang
et al. plot budgets), so the check is their code: Huang et al.'s PyTorch implementation in the ScaleFL authors'
``msdnet24_4`` configuration, built here and measured with the same FLOP counter, has exactly these parameters (per
classifier too) and MACs (tests/test_models_msdnet.py). ScaleFL's Eq. (1) on CIFAR-10 MACs (epsilon 0.1) cuts the
levels at 12 layers x width 0.5, 14 x 0.58, 18 x 0.75 and 24 x 1; the authors' README runs layers 15/18/21 at
widths 0.65/0.7/0.85/1, hard-coded.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from .base import MultiExitModel, norm2d, scaled
from .chunks import mark_chunks
from .registry import FamilyEntry, register_family


@dataclass(frozen=True)
class MSDNetConfig:
    """Huang et al.'s hyper-parameters (their CIFAR values by default)."""

    layers: int = 24
    channels: int = 16  # at the finest scale; scale s has channels x factors[s]
    growth: int = 6  # new channels per layer at the finest scale; scale s adds growth x factors[s]
    factors: tuple[int, ...] = (1, 2, 4)  # one per scale: channel (growth) factors
    bottleneck_factors: tuple[int, ...] = (1, 2, 4)  # a bottleneck is at most factor x its conv's output channels
    reduction: float = 0.5  # a transition keeps floor(reduction x C) channels
    classifier: int = 128  # channels of an exit classifier's convolutions

    @property
    def scales(self) -> int:
        return len(self.factors)


CIFAR = MSDNetConfig()
DEFAULT_EXITS = (5, 11, 17, 23)  # after layers 6, 12, 18, 24 (0-based blocks)


# ---- layout: every channel count of the width-1 network, as plain values --------------------------------------
@dataclass(frozen=True)
class DenseConv:
    """One conv of a layer: the chunks it reads, its bottleneck width, its output channels and stride."""

    chunks: tuple[int, ...]
    inner: int
    out: int
    stride: int


@dataclass(frozen=True)
class ScaleUnit:
    """What a layer computes at one scale: conv(finer scale, strided) unless it is the finest kept scale of a layer
    that drops none, and conv(same scale); ``finer`` and ``same`` index the layer's input list."""

    down: DenseConv | None
    normal: DenseConv
    finer: int | None
    same: int


@dataclass(frozen=True)
class Transition:
    """conv1x1 per kept scale: (chunks read, output channels)."""

    convs: tuple[tuple[tuple[int, ...], int], ...]


@dataclass(frozen=True)
class Layer:
    """One MSDNet layer: its scales' units, the transition that ends it (or None), what its exit reads."""

    units: tuple[ScaleUnit, ...]  # one per output scale, finest first
    transition: Transition | None
    exit_chunks: tuple[int, ...]  # chunks of the coarsest scale after the layer (what its exit reads)


def layer_scales(n: int, cfg: MSDNetConfig) -> tuple[int, int]:
    """(input scales, output scales) of 1-based layer ``n`` ("prune max": one scale fewer every ceil(L / S) layers)."""
    interval = math.ceil(cfg.layers / cfg.scales)
    return cfg.scales - max(0, n - 2) // interval, cfg.scales - (n - 1) // interval


def layout(cfg: MSDNetConfig = CIFAR) -> tuple[tuple[int, ...], tuple[Layer, ...]]:
    """(stem's output channels per scale, every layer's plan) at width 1."""
    stem = tuple(cfg.channels * f for f in cfg.factors)
    chunks = [[c] for c in stem]  # chunks of the concatenation at each scale
    base = cfg.channels  # the per-scale channel unit: scale s holds base x factors[s] channels
    layers = []
    for n in range(1, cfg.layers + 1):
        n_in, n_out = layer_scales(n, cfg)
        first_in, first_out = cfg.scales - n_in, cfg.scales - n_out
        units = []
        for s in range(first_out, cfg.scales):
            grow = cfg.growth * cfg.factors[s]
            if s == first_out and n_in == n_out:  # the finest scale: no finer one to read
                units.append(ScaleUnit(None, _conv(chunks[s], grow, cfg.bottleneck_factors[s], 1), None, s - first_in))
                continue
            half = max(grow // 2, 1)
            down = _conv(chunks[s - 1], half, cfg.bottleneck_factors[s - 1], 2)
            normal = _conv(chunks[s], half, cfg.bottleneck_factors[s], 1)
            units.append(ScaleUnit(down, normal, s - 1 - first_in, s - first_in))
        for s, unit in zip(range(first_out, cfg.scales), units):
            chunks[s] = chunks[s] + ([unit.down.out] if unit.down else []) + [unit.normal.out]
        base += cfg.growth
        transition = None
        if n_in > n_out and cfg.reduction > 0:
            base = max(math.floor(cfg.reduction * base), 1)
            kept = range(first_out, cfg.scales)
            transition = Transition(tuple((tuple(chunks[s]), base * cfg.factors[s]) for s in kept))
            for s in kept:
                chunks[s] = [base * cfg.factors[s]]
        layers.append(Layer(tuple(units), transition, tuple(chunks[-1])))
    return stem, tuple(layers)


def _conv(chunks: list[int], out: int, bottleneck_factor: int, stride: int) -> DenseConv:
    """A bottleneck conv reading ``chunks``: its 1x1 narrows to min(C_in, bottleneck_factor x out) (Huang's rule)."""
    return DenseConv(tuple(chunks), min(sum(chunks), bottleneck_factor * out), out, stride)


def unit_channels(cfg: MSDNetConfig = CIFAR) -> tuple[int, ...]:
    """Every distinct width-1 channel count a width ratio scales (what ``ModelFamily.signature`` compares)."""
    stem, layers = layout(cfg)
    counts = set(stem) | {cfg.classifier}
    for layer in layers:
        for unit in layer.units:
            counts |= {c.inner for c in (unit.down, unit.normal) if c} | {c.out for c in (unit.down, unit.normal) if c}
        if layer.transition:
            counts |= {out for _, out in layer.transition.convs}
    return tuple(sorted(counts))


# ---- modules ------------------------------------------------------------------------------------------------
def conv_norm_relu(in_ch: int, out_ch: int, kernel: int, stride: int, norm: str) -> nn.Sequential:
    """conv (no bias) -> norm -> ReLU: MSDNet's ConvBasic."""
    return nn.Sequential(OrderedDict(conv=nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, bias=False),
                                     norm=norm2d(out_ch, norm), relu=nn.ReLU(inplace=True)))


class BottleneckConv(nn.Sequential):
    """conv1x1-BN-ReLU to the bottleneck width (reading the chunks), then conv3x3-BN-ReLU (stride 1 or 2)."""

    def __init__(self, conv: DenseConv, width: float, norm: str):
        chunks = [scaled(c, width) for c in conv.chunks]
        inner, out = scaled(conv.inner, width), scaled(conv.out, width)
        reduce = conv_norm_relu(sum(chunks), inner, 1, 1, norm)
        mark_chunks(reduce.conv, chunks)
        super().__init__(OrderedDict(reduce=reduce, conv=conv_norm_relu(inner, out, 3, conv.stride, norm)))


class DenseUnit(nn.Module):
    """One scale of a layer: its input, then the new channels of the strided conv of the finer scale and of the conv
    of the same scale, concatenated (dense connectivity)."""

    def __init__(self, unit: ScaleUnit, width: float, norm: str):
        super().__init__()
        self.down = None if unit.down is None else BottleneckConv(unit.down, width, norm)
        self.normal = BottleneckConv(unit.normal, width, norm)
        self.finer, self.same = unit.finer, unit.same

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        same = xs[self.same]
        new = [same] if self.down is None else [same, self.down(xs[self.finer])]
        return torch.cat(new + [self.normal(same)], dim=1)


class MSDNetLayer(nn.Module):
    """One MSDNet layer (a hetfl block): a list of scales in, a list of (as many or fewer) scales out."""

    def __init__(self, layer: Layer, width: float, norm: str):
        super().__init__()
        self.units = nn.ModuleList(DenseUnit(u, width, norm) for u in layer.units)
        self.transition = None
        if layer.transition is not None:
            convs = []
            for chunks, out in layer.transition.convs:
                sizes = [scaled(c, width) for c in chunks]
                convs.append(conv_norm_relu(sum(sizes), scaled(out, width), 1, 1, norm))
                mark_chunks(convs[-1].conv, sizes)
            self.transition = nn.ModuleList(convs)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = [unit(xs) for unit in self.units]
        return out if self.transition is None else [t(x) for t, x in zip(self.transition, out)]


class Stem(nn.Module):
    """MSDNet's first layer: the finest scale at the input's resolution, then each coarser one at half the last."""

    def __init__(self, in_ch: int, channels: tuple[int, ...], width: float, norm: str):
        super().__init__()
        convs, prev = [], in_ch
        for s, c in enumerate(channels):
            convs.append(conv_norm_relu(prev, scaled(c, width), 3, 1 if s == 0 else 2, norm))
            prev = scaled(c, width)
        self.scales = nn.ModuleList(convs)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for conv in self.scales:
            x = conv(x)
            out.append(x)
        return out


class Classifier(nn.Module):
    """An exit: on the coarsest scale, two strided conv3x3-BN-ReLU, global average pool, Linear."""

    def __init__(self, chunks: tuple[int, ...], hidden: int, num_classes: int, width: float, norm: str):
        super().__init__()
        sizes, hidden = [scaled(c, width) for c in chunks], scaled(hidden, width)
        self.convs = nn.Sequential(conv_norm_relu(sum(sizes), hidden, 3, 2, norm),
                                   conv_norm_relu(hidden, hidden, 3, 2, norm), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        mark_chunks(self.convs[0].conv, sizes)
        self.linear = nn.Linear(hidden, num_classes)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.linear(self.convs(xs[-1]))


def init_weights(model: nn.Module) -> None:
    """Huang et al.'s initialisation: convs He-normal over the output fan, BN (1, 0), Linear bias 0."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)


def build_msdnet(input_shape, num_classes, *, width: float = 1.0, depth: int | None = None, norm: str = "bn",
                 exit_after: tuple[int, ...] = DEFAULT_EXITS, config: MSDNetConfig = CIFAR) -> MultiExitModel:
    """MSDNet cut after ``depth`` layers (default all) at width ratio ``width``, exits after the layers of
    ``exit_after`` (0-based) below that depth."""
    stem_channels, layers = layout(config)
    depth = len(layers) if depth is None else depth
    kept = tuple(b for b in exit_after if b < depth)
    model = MultiExitModel(Stem(input_shape[0], stem_channels, width, norm),
                           [MSDNetLayer(layer, width, norm) for layer in layers[:depth]],
                           [Classifier(layers[b].exit_chunks, config.classifier, num_classes, width, norm)
                            for b in kept], kept)
    init_weights(model)
    return model


register_family("msdnet24", FamilyEntry(CIFAR.layers, DEFAULT_EXITS, unit_channels(CIFAR), build_msdnet, dense=True))
