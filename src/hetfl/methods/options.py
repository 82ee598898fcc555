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
