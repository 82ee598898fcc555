"""Fine-tuning modes of a pretrained backbone (ReeFL Sec. 4.1.3): what of it trains, and what is added.

* ``full``   - every backbone tensor trains (and travels).
* ``frozen`` - the backbone is frozen; only exits (and a method's own modules, e.g. Ree) train.
* ``lora``   - LoRA (Hu et al., 2022) on the query and value projections (``LoraLinear``, peft's LoRA
  reproduced bit for bit with torch alone); rank r, alpha = 2r (ReeFL Appendix A: r 32, alpha 64).
* ``pa``     - parallel adapters (He et al., 2022): a bottleneck reading a sublayer's input, added
  to its output, beside every attention and feed-forward sublayer.
* ``sa``     - serial adapters (Houlsby et al., 2019): a bottleneck on a sublayer's output, added
  to it, after every attention and feed-forward sublayer, before the residual sum and LayerNorm.
* ``ssf``    - SSF (Lian et al., 2022): a learned scale and shift of the output of every Linear
  and LayerNorm of the backbone.

In every mode but ``full`` the backbone's own tensors are frozen (``requires_grad`` off), so
``federated_state`` leaves them out of what travels and what is aggregated. Added modules start
as the identity (adapters' up-projections and LoRA's B at zero, SSF's scale at one, shift at
zero), so round 0 runs the pretrained function; their other weights are seeded by the builder.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FINETUNE_MODES = ("full", "frozen", "lora", "pa", "sa", "ssf")


class Bottleneck(nn.Module):
    """An adapter: up(GELU(down(x))), the up-projection zero at start."""

    def __init__(self, dim: int, rank: int):
        super().__init__()
        self.down = nn.Linear(dim, rank)
        self.up = nn.Linear(rank, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x):
        return self.up(nn.functional.gelu(self.down(x)))


class LoraLinear(nn.Module):
    """LoRA around a frozen Linear: base(x) + B(A(x)) * alpha / r (Hu et al., 2022, Eq. 3), B zero at start.

    It is peft's LoRA layer (``inject_adapter_in_model`` with dropout 0) with torch alone, so that a machine without
    peft (a GPU image with torch alone) trains the same model: the same tensor names (``base_layer``,
    ``lora_A.default``, ``lora_B.default``), the same draws from the global generator (A and B made as Linears,
    then A drawn again, Kaiming-uniform with a = sqrt(5)) and the same forward (``tests/test_text.py`` checks all
    three against peft).
    """

    ADAPTER = "default"  # peft's adapter name, part of every LoRA tensor's name

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({self.ADAPTER: nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({self.ADAPTER: nn.Linear(rank, base.out_features, bias=False)})
        nn.init.kaiming_uniform_(self.lora_A[self.ADAPTER].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B[self.ADAPTER].weight)
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base_layer(x) + self.lora_B[self.ADAPTER](self.lora_A[self.ADAPTER](x)) * self.scaling


class ScaleShift(nn.Module):
    """SSF around a frozen layer: layer(x) * scale + shift over the last dimension."""

    def __init__(self, layer: nn.Linear | nn.LayerNorm):
        super().__init__()
        self.layer = layer
        dim = layer.out_features if isinstance(layer, nn.Linear) else layer.normalized_shape[0]
        self.scale = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.layer(x) * self.scale + self.shift


def _wrap_scale_shift(module: nn.Module) -> None:
    """Replace every Linear and LayerNorm under ``module`` by ``ScaleShift`` around it."""
    for name, child in list(module.named_children()):
        if isinstance(child, (nn.Linear, nn.LayerNorm)):
            setattr(module, name, ScaleShift(child))
        else:
            _wrap_scale_shift(child)


def apply_finetune(backbone: list[nn.Module], blocks: list[nn.Module], mode: str, rank: int) -> None:
    """Freeze the pretrained ``backbone`` modules and add ``mode``'s trainable modules (in place).

    ``blocks`` are the transformer layers (``EncoderBlock``: adapters go into their ``adapter``
    slots, LoRA into their ``query``/``value`` projections).
    """
    if mode == "full":
        return
    for module in backbone:
        module.requires_grad_(False)
    if mode == "lora":
        for block in blocks:
            for name in ("query", "value"):  # in this order: the generator's draws follow it
                setattr(block, name, LoraLinear(getattr(block, name), rank, alpha=2 * rank))
    elif mode in ("pa", "sa"):
        for block in blocks:
            block.add_adapters(rank, parallel=mode == "pa")
    elif mode == "ssf":
        for module in backbone:
            _wrap_scale_shift(module)
