"""Options a method declares for itself (DESIGN.md, "config: each method validates its own options").

A method's ``Options`` is a frozen dataclass of ``opt`` fields: the CLI makes a flag of each
field and TOML files take it as a key, like the generic options; ``check`` validates the values
against the rest of the config. Shared option groups (DepthFL Eq. (1)'s mutual KD, used by
DepthFL and by ExclusiveFL trained like it) live here; a method's own live in its file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import HetflError
from ..options import Range, opt


@dataclass(frozen=True)
class NoOptions:
    """A method with no options of its own."""

    def check(self, cfg) -> None:
        """Raise HetflError naming the first value not allowed with ``cfg``."""


@dataclass(frozen=True)
class MutualKD(NoOptions):
    """The weight of a distillation among exits (DepthFL Eq. (1)'s mutual KD; ReeFL's best-exit KD), and its ramp-up."""

    kd_weight: float = opt(0.0, "weight of the distillation among exits: DepthFL Eq. (1)'s mutual KD, ReeFL Eq. (5)'s "
                                "best-exit KD (0 = off)", valid=Range(0))
    kd_ramp: float = opt(0.0, "ramp the KD weight by exp(-5 (1 - t/R)^2) over the first R = kd_ramp x rounds "
                              "rounds, a fraction in [0, 1] (DepthFL: 0.3, its 300 of 1000 rounds; 0 = no ramp)",
                         valid=Range(0, 1))

    def kd_weight_at(self, round_index: int, rounds: int) -> float:
        """The KD weight at a 1-based round of ``rounds``: the DepthFL code's consistency ramp-up,
        exp(-5 (1 - t/R)^2) with R = kd_ramp x rounds (the paper's 300 of 1000 rounds scaled to the run)."""
        ramp = self.kd_ramp * rounds
        if ramp <= 0:
            return self.kd_weight
        progress = min(round_index, ramp) / ramp
        return self.kd_weight * math.exp(-5.0 * (1.0 - progress) ** 2)


@dataclass(frozen=True)
class LabelMask(NoOptions):
    """Label masking for non-IID clients, as HeteroFL's and FedRolex's authors' code does it.

    In training, the logits of the classes a client holds no sample of are set to 0 before its loss (HeteroFL, Diao
    et al. 2021: its "masking trick" for non-IID data; the code's ``out.masked_fill(label_mask == 0, 0)`` in
    ``models/conv.py`` and ``models/resnet.py``, which FedRolex's code keeps): their classifier rows get no
    gradient from the client's data. In aggregation, every classifier row (weight row and bias of the exits' last
    Linear) is averaged over the clients that hold its class only (both codes' ``Federation.combine`` /
    ``ResnetServerRoll.combine`` index the classifier by each client's ``label_split``). A client holding every class
    masks nothing, so under IID the option changes nothing. The client tells the server which classes it holds.

    Added after run folders were named: ``false`` is not recorded, so runs made before it keep their folders and a
    method that defaults it on records ``true``.
    """

    label_mask: bool = opt(False, "width methods: set the logits of the classes a client holds no sample of to 0 in "
                                  "its loss, and average each classifier row only over the clients that hold its "
                                  "class (HeteroFL's masking trick; HeteroFL's and FedRolex's code: on for heterofl, "
                                  "sheterofl and fedrolex; FjORD's baseline has none: off for fjord)",
                           added_later=True)
