"""HeteroFL (Diao et al., ICLR 2021) and SHeteroFL (DepthFL Sec. 4, Table 3): width-scaled sub-models.

* Sec. 3.1 - a client of level j trains the leading ``r_j`` share of the channels of every layer
  (image channels and classes kept), r_j from ``widths`` (default 1/4, 2/4, 3/4, 1 as in DepthFL)
  -> ``plan`` with ``scaling = width``; every tensor is the leading corner of the global one.
* Sec. 3.1 - aggregation: each element averaged over the clients that hold it -> ``MaskedMean``.
* Sec. 3.2 - Scaler (``scaler``: activations divided by r_j in training) and static BN
  (statistics computed on the training data before inference: hetfl's rule for every method).
* Inference: the full-width model's classifier; every width is also evaluated ("global sub-models").

SHeteroFL: a client also trains every smaller width it can afford, as in slimmable networks: the
local loss adds the CE of each smaller-width sub-network, run on the leading slices of the same
parameters (so their gradients land on the shared channels).
"""

from __future__ import annotations

from ..slicing import SubModel
from ..recipes import Slimmable
from .base import Method


class HeteroFL(Method):
    name = "heterofl"
    summary = "width-scaled sub-models (leading channels of every layer), element-wise averaging (HeteroFL)"
    defaults = {"scaling": "width", "train_exits": "last", "scaler": True,
                "aggregation_weights": "uniform"}
    scalings = ("width",)

    def width_spec(self, width: float) -> SubModel:
        """The full-depth model at ``width`` times the global channels."""
        return self.spec(self.family.arch.num_blocks, width=width)

    def plan(self, client, budget, round_index) -> SubModel:
        """The width of the client's level (or the widest its budget fits)."""
        return self.fit(budget)

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
