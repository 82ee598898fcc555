"""HeteroFL (Diao et al., ICLR 2021) and SHeteroFL (DepthFL Sec. 4, Table 3): width-scaled sub-models.

* Sec. 3.1 - a client of level j trains the leading ``r_j`` share of the channels of every layer
  (image channels and classes kept), r_j from ``widths`` (default 1/4, 2/4, 3/4, 1 as in DepthFL)
  -> ``plan`` with ``scaling = width``; every tensor is the leading corner of the global one, but for
  dense layers' inputs (MSDNet), which keep the leading share of every concatenated chunk (``slicing``).
* Sec. 3.1 - aggregation: each element averaged over the clients that hold it -> ``MaskedMean``.
* Sec. 3.2 - Scaler (``scaler``: activations divided by r_j in training) and static BN
  (statistics computed on the training data before inference: hetfl's rule for every method).
* Inference: the full-width model's classifier; every width is also evaluated ("global sub-models").
* Masking trick for non-IID data (``label_mask``, on by default as in the authors' code, whose models mask the
  logits of the classes a client lacks and whose ``Federation.combine`` averages each classifier row over the
  clients holding its class) -> ``methods.options.LabelMask``: ``TrainOptions.label_mask`` in the task, the client's
  classes in its update, ``held_rows`` in aggregation. Under IID it changes nothing.

SHeteroFL: a client also trains every smaller width it can afford, as in slimmable networks: the
local loss adds the CE of each smaller-width sub-network, run on the leading slices of the same
parameters (so their gradients land on the shared channels).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..models.base import classifier_names
from ..recipes import Slimmable
from ..slicing import SubModel
from ..updates import Update
from .base import Method
from .options import LabelMask


class HeteroFL(Method):
    name = "heterofl"
    summary = "width-scaled sub-models (leading channels of every layer), element-wise averaging (HeteroFL)"
    Options = LabelMask
    defaults = {"scaling": "width", "train_exits": "last", "scaler": True,
                "aggregation_weights": "uniform", "label_mask": True}
    scalings = ("width",)

    def __init__(self, cfg, family, num_levels, device="cpu"):
        super().__init__(cfg, family, num_levels, device)
        self.train_options = replace(self.train_options, label_mask=self.options.label_mask)
        self._classifiers: tuple[str, ...] | None = None

    def width_spec(self, width: float) -> SubModel:
        """The full-depth model at ``width`` times the global channels."""
        return self.spec(self.family.arch.num_blocks, width=width)

    def plan(self, client, budget, round_index) -> SubModel:
        """The width of the client's level (or the widest its budget fits)."""
        return self.fit(budget)

    def held_rows(self, update: Update) -> dict[str, torch.Tensor] | None:
        """With label masking, the classifier rows of the classes ``update``'s client holds: only they count in the
        mean (the masking trick's aggregation); None when it holds every class (nothing masked) or masks nothing."""
        num_classes = self.family.num_classes
        if not self.options.label_mask or update.classes is None or len(update.classes) == num_classes:
            return None
        if self._classifiers is None:
            self._classifiers = classifier_names(self.models.module(self.full_spec()), num_classes)
        held = torch.zeros(num_classes, dtype=torch.bool)
        held[list(update.classes)] = True
        return {name: held for name in self._classifiers if name in update.state}

    def eval_specs(self):
        specs = {"global": self.width_spec(1.0)}
        specs.update({f"width{w:g}": self.width_spec(w) for w in self.cfg.level_widths if w < 1})
        return specs


class SHeteroFL(HeteroFL):
    name = "sheterofl"
    summary = "HeteroFL where each client also trains every smaller width it can afford (DepthFL Table 3)"

    def recipe(self, spec: SubModel, round_index: int) -> Slimmable:
        """CE of the client's width plus the CE of every smaller level width, on shared leading slices."""
        return Slimmable(smaller=tuple(self.width_spec(w) for w in self.cfg.level_widths if w < spec.width))
