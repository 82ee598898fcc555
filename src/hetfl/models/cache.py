"""Sub-model objects: built once per architecture and reused across clients and rounds (DESIGN.md, "Performance").

Both sides use it: the server to cut and evaluate sub-models, a client to train the one its task
names. ``family_of`` rebuilds, from a task's plain description, the family the server described
with ``describe_family``, so a client in another process builds the same backbone.
"""

from __future__ import annotations

import torch
from torch import nn

from ..slicing import State, SubModel
from ..task import FamilySpec
from . import ModelFamily, model_family
from .base import BaseEnsemble, NoNorm, federated_state


def attach_scaler(model: nn.Module, rate: float) -> nn.Module:
    """``model`` with HeteroFL's Scaler: in training, the input of every normalisation layer of the
    stem and blocks is divided by ``rate``.

    Diao et al. (2021), Sec. 3.2 "Scaler": a width-r sub-model's activations are 1/r times smaller
    than the full model's, so training rescales them; inference (eval mode) is unscaled. HeteroFL's
    code puts the Scaler right before each normalisation layer (``NoNorm`` marks those places in a
    network built without BatchNorm), so a convolution that feeds a residual sum directly is not
    rescaled and training and inference run the same function up to the normalisation.
    """
    def scale(module, inputs):
        return (inputs[0] / rate,) if module.training else None

    for part in (model.stem, model.blocks):
        for layer in part.modules():
            if isinstance(layer, (nn.modules.batchnorm._BatchNorm, NoNorm)):
                layer.register_forward_pre_hook(scale)
    return model


def build_model(family: ModelFamily, spec: SubModel, seed: int | None = None) -> nn.Module:
    """The module of ``spec`` cut from ``family`` (seeded if asked): its depth and width holding only its exits,
    or SplitMix's bases (base i seeded with ``seed + i``)."""
    if spec.bases:
        base = SubModel(spec.depth, spec.width)
        return BaseEnsemble({i: build_model(family, base, None if seed is None else seed + i) for i in spec.bases})
    model = family.build(depth=spec.depth, width=spec.width, seed=seed)
    return model.keep_exits(spec.exits) if spec.exits is not None else model


class ModelCache:
    """One module object per sub-model architecture, reused across clients and rounds (no re-allocation).

    A module's state that travels is ``federated_state``: frozen pretrained tensors are built with
    the module from the pretrained files, never loaded or sent, and never change.
    """

    def __init__(self, family: ModelFamily, device: torch.device | str = "cpu", scaler: bool = False):
        self.family = family
        self.device = torch.device(device)
        self.scaler = scaler
        self._modules: dict[tuple, nn.Module] = {}
        self._shapes: dict[tuple, dict[str, torch.Size]] = {}

    def _key(self, spec: SubModel) -> tuple:
        """What the architecture depends on: not the name group, nor the window (``offset``) the tensors come from."""
        return (spec.depth, spec.width, spec.exits, spec.bases)

    def module(self, spec: SubModel) -> nn.Module:
        """The module with ``spec``'s architecture (its weights are whatever was loaded last)."""
        key = self._key(spec)
        if key not in self._modules:
            model = build_model(self.family, spec)
            if self.scaler and spec.width < 1:
                attach_scaler(model, spec.width)
            self._modules[key] = model.to(self.device)
        return self._modules[key]

    def shapes(self, spec: SubModel) -> dict[str, torch.Size]:
        """Local tensor shapes of ``spec``, by name (what ``slicing.extract`` cuts: a narrower width of a backbone with
        dense layers needs the family's chunks in its spec, else its inputs would be cut as leading corners)."""
        if self.family.dense and spec.width != 1 and not spec.bases and spec.chunks != self.family.chunks:
            raise ValueError(f"{spec.width:g}-width sub-model of {self.family.name} lacks its dense layers' chunks "
                             "(SubModel.chunks = ModelFamily.chunks)")
        key = self._key(spec)
        if key not in self._shapes:
            self._shapes[key] = {n: t.shape for n, t in federated_state(self.module(spec)).items()}
        return self._shapes[key]

    def loaded(self, spec: SubModel, state: State) -> nn.Module:
        """The module of ``spec`` holding ``state`` (every tensor of its federated state, nothing else)."""
        module = self.module(spec)
        missing, unexpected = module.load_state_dict(state, strict=False)
        expected = set(module.state_dict()) - set(self.shapes(spec))  # the frozen tensors
        if unexpected or set(missing) != expected:
            wrong = sorted(set(unexpected) | (set(missing) - expected))
            raise ValueError(f"state does not match the federated tensors of {spec}: {wrong[:3]}")
        return module


def family_of(spec: FamilySpec) -> ModelFamily:
    """The model family a task names, rebuilt from the registry."""
    return model_family(spec.name, spec.input_shape, spec.num_classes, spec.width, spec.norm, spec.exit_after,
                        spec.finetune, spec.adapter_rank, spec.head)


def describe_family(family: ModelFamily) -> FamilySpec:
    """The serialisable description of ``family``."""
    return FamilySpec(family.name, family.input_shape, family.num_classes, family.base_width, family.norm,
                      family.arch.exit_after, family.finetune, family.adapter_rank, family.head)
