"""Model families: each builds the global model or any (depth, width) sub-model of it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial

import torch

from ..errors import HetflError
from . import cifar_resnet, convnet, minilm, msdnet, resnet, vit  # noqa: F401  (each registers its families)
from .base import ArchSpec, MultiExitModel, scaled
from .chunks import Chunks, channel_chunks
from .finetune import FINETUNE_MODES
from .ree import HEAD_KINDS, ReeModel
from .registry import FAMILIES, FamilyEntry, image_input, register_family


@dataclass(frozen=True)
class ModelFamily:
    """A backbone family bound to a dataset's shapes: ``build(depth, width)`` gives a sub-model."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    arch: ArchSpec
    builder: Callable[..., MultiExitModel] = field(compare=False)  # fixed by the name and the exits: equal families
    # (and so the cost model's caches) do not depend on which call made them
    base_width: float = 1.0  # the global model's own width multiplier
    norm: str = "bn"
    channels: tuple[int, ...] = ()  # what a width ratio scales (channels, or the ViT's heads), at width 1
    finetune: str = "full"  # what of a pretrained backbone trains (``finetune.FINETUNE_MODES``)
    adapter_rank: int = 32  # rank of LoRA and of the adapters
    head: str = "exits"  # an exit per exit block, or ReeFL's Ree + shared classifier (``ree.HEAD_KINDS``)
    example_input: Callable[..., torch.Tensor] = image_input  # example_input(batch, input_shape, generator)
    pretrained: bool = False
    dense: bool = False  # some layers read concatenated channel chunks (``chunks``)

    @property
    def chunks(self) -> Chunks:
        """(name, dimension, width-1 chunk sizes) of every tensor whose input channels concatenate chunks (dense
        connections, ``models.chunks``): what ``slicing.SubModel.chunks`` carries so that a width slice keeps the
        leading share of each chunk; () for backbones without dense connections."""
        if not self.dense:
            return ()
        return _unit_chunks(self.name, self.input_shape, self.num_classes, self.norm, self.arch.exit_after)

    def build(self, depth: int | None = None, width: float = 1.0, seed: int | None = None) -> MultiExitModel:
        """A sub-model with ``depth`` blocks at ``width`` times the global channels, seeded if asked.

        Convolution weights are stored channels-last: oneDNN's CPU convolutions (and cuDNN's) run
        faster on it (measured here: training steps of the CNN ~20% faster, evaluation ~40%);
        values, and so results, are the same whatever the layout.
        """
        depth = self.arch.num_blocks if depth is None else depth
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            tuning = {"finetune": self.finetune, "adapter_rank": self.adapter_rank} if self.pretrained else {}
            model = self.builder(self.input_shape, self.num_classes, width=self.base_width * width,
                                 depth=depth, norm=self.norm, **tuning)
            if self.head != "exits":
                model = ReeModel(model, self.num_classes, modulate=self.head != "ree-unmodulated",
                                 into_cls=self.head == "ree-cls")
        return model.to(memory_format=torch.channels_last)

    def inputs(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """A batch of example inputs for cost measurements (images, or token ids), seeded when asked."""
        return self.example_input(batch, self.input_shape, generator)

    def exits_at_depth(self, depth: int) -> int:
        """Number of exits a depth-``depth`` model holds."""
        return sum(1 for b in self.arch.exit_after if b < depth)

    def signature(self, width: float) -> tuple[int, ...]:
        """The channel counts a width ratio gives: two widths with one signature build the same architecture."""
        return tuple(scaled(c, self.base_width * width) for c in self.channels)

    def with_exits(self, exit_after: tuple[int, ...]) -> ModelFamily:
        """The same family with exits after the blocks ``exit_after`` (0-based, increasing)."""
        return model_family(self.name, self.input_shape, self.num_classes, self.base_width, self.norm, exit_after,
                            self.finetune, self.adapter_rank, self.head)


MODEL_NAMES = tuple(FAMILIES)
NORMS = ("bn", "none")


def model_family(name: str, input_shape: tuple[int, ...], num_classes: int, width: float = 1.0, norm: str = "bn",
                 exit_after: tuple[int, ...] | None = None, finetune: str = "full", adapter_rank: int = 32,
                 head: str = "exits") -> ModelFamily:
    """The family called ``name`` for inputs of ``input_shape`` and ``num_classes`` classes.

    ``exit_after`` places the exits (0-based blocks, the last block included) where a method asks;
    by default the CNN, the ViT and MiniLM have an exit after every block, the ResNets after every
    stage. ``finetune`` and ``adapter_rank`` set up a pretrained backbone (``finetune.py``);
    ``head`` = "ree" or "ree-unmodulated" puts ReeFL's Ree and shared classifier on it (``ree.py``).
    """
    if name not in FAMILIES:
        raise HetflError(f"model '{name}' is unknown; choose one of: {', '.join(FAMILIES)}")
    entry = FAMILIES[name]
    if finetune not in FINETUNE_MODES:
        raise HetflError(f"finetune '{finetune}' is unknown; choose one of: {', '.join(FINETUNE_MODES)}")
    if finetune != "full" and not entry.pretrained:
        pretrained = ", ".join(n for n, e in FAMILIES.items() if e.pretrained)
        raise HetflError(f"finetune '{finetune}' needs a pretrained backbone ({pretrained}); model '{name}' trains "
                         "from scratch: drop --finetune or set it to full")
    if adapter_rank < 1:
        raise HetflError(f"adapter_rank must be an integer >= 1, got {adapter_rank}")
    if head not in HEAD_KINDS:
        raise HetflError(f"head '{head}' is unknown; choose one of: {', '.join(HEAD_KINDS)}")
    if len(input_shape) != (1 if entry.text else 3):
        wanted = ("token ids: use a text dataset (20ng, r8, text:DIR)" if entry.text
                  else "images: a text dataset needs --model minilm")
        raise HetflError(f"model '{name}' reads {wanted}; got inputs of shape {tuple(input_shape)}")
    num_blocks = entry.blocks()
    exits = tuple(entry.exits() if exit_after is None else exit_after)
    if not exits or list(exits) != sorted(set(exits)) or exits[-1] != num_blocks - 1 or exits[0] < 0:
        raise HetflError(f"exits of {name} must be increasing blocks in 0..{num_blocks - 1} ending with the "
                         f"last block {num_blocks - 1}, got {list(exits)}")
    family = ModelFamily(name, tuple(input_shape), num_classes, ArchSpec(num_blocks, exits),
                         partial(entry.builder, exit_after=exits), width, norm, entry.channels, finetune,
                         adapter_rank, head, entry.example_input, entry.pretrained, entry.dense)
    if not entry.pretrained:  # a pretrained backbone's size is its checkpoint's
        _check_fits_memory(family)
    return family


# what training holds per parameter, in parameters: the global model, the client's copy, its gradient, its momentum
# and the server's running sum (evaluation and activations come on top)
TRAINING_COPIES = 5


def _check_fits_memory(family: ModelFamily) -> None:
    """Returns None; raises HetflError when training the global model would not fit in this machine's memory,
    counted on the meta device (no memory is allocated), before anything allocates it."""
    size = _parameter_bytes(family.name, family.input_shape, family.num_classes, family.base_width, family.norm,
                            family.arch.exit_after)
    memory = physical_memory()
    if TRAINING_COPIES * size > memory:
        raise HetflError(f"model_width {family.base_width:g} makes a {family.name} of {size:.3g} bytes of parameters; "
                         f"training holds about {TRAINING_COPIES} copies and this machine has {memory / 2 ** 30:.1f} "
                         f"GiB of memory: choose a smaller model_width")


@lru_cache(maxsize=64)
def _parameter_bytes(name: str, input_shape: tuple[int, ...], num_classes: int, width: float, norm: str,
                     exit_after: tuple[int, ...]) -> int:
    """Bytes of the parameters of the full model of a family (built on the meta device once per process: families
    are made again and again, for every method, client and set of exits)."""
    entry = FAMILIES[name]
    with torch.device("meta"):
        model = entry.builder(input_shape, num_classes, width=width, depth=entry.blocks(), norm=norm,
                              exit_after=exit_after)
    return sum(p.numel() * p.element_size() for p in model.parameters())


@lru_cache(maxsize=64)
def _unit_chunks(name: str, input_shape: tuple[int, ...], num_classes: int, norm: str,
                 exit_after: tuple[int, ...]) -> Chunks:
    """The chunk marks of the width-1 model of a family with dense connections (built once per process on the meta
    device): the chunk sizes a width ratio scales, whatever the global model's own width."""
    entry = FAMILIES[name]
    with torch.device("meta"):
        model = entry.builder(input_shape, num_classes, width=1.0, depth=entry.blocks(), norm=norm,
                              exit_after=exit_after)
    return channel_chunks(model)


def physical_memory() -> int:
    """Bytes of memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


__all__ = ["ArchSpec", "FAMILIES", "FamilyEntry", "ModelFamily", "MultiExitModel", "MODEL_NAMES", "NORMS", "FINETUNE_MODES", "HEAD_KINDS",
           "model_family", "register_family"]
