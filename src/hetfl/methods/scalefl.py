"""ScaleFL (Ilhan et al., CVPR 2023): 2-D (depth x width) sub-models with early exits and self-distillation.

* Sec. 3.1.1, Eq. (1), Alg. 1 lines 2-5 - for each level l with target cost ratio r_l
  (``budget_ratios``, default 12.5/25/50/100%) and tolerance epsilon_l (``split_epsilon``), the
  most uniform split (s_d, s_w) within tolerance, exits placed after block floor(s_d N)
  (``scaling = 2d``: ``splits.split_search``, shared with the baselines run on the same levels).
* Sec. 3.1.2 - split: the depth cut, then the leading s_w share of every layer's channels.
* Exit heads of the CIFAR ResNets are ScaleFL's (3 x conv-BN-ReLU, pool, linear); the CNN keeps
  its pool + linear exits, MSDNet-24 (Sec. 4.3, ``models.msdnet``) its own classifiers after any of
  its 24 layers.
* Eq. (5) - local loss: exits weighted by index, KD from the local model's last exit (tau, beta),
  the teacher detached (``recipe``: ``losses.weighted_exits_with_last_teacher``).
* Eq. (2) - aggregation: every element averaged over the clients holding it, unweighted.
* Evaluation: "global" (the full model's exits), every level's model, and with
  ``client_test_fraction`` > 0 "local" accuracy (each client's level model on its own test split).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HetflError
from ..options import Range, opt
from ..slicing import SubModel
from ..recipes import LastTeacher
from .base import Method
from .options import NoOptions


@dataclass(frozen=True)
class Options(NoOptions):
    """Eq. (5)'s distillation from the last exit."""

    kd_temperature: float = opt(3.0, "ScaleFL: temperature tau of the distillation from the last exit",
                               valid=Range(0, low_open=True))
    scalefl_beta: float = opt(0.1, "ScaleFL: weight beta of the distillation from the last exit, Eq. (5)",
                              valid=Range(0, 1, high_open=True))
    scalefl_normaliser: str = opt("sum", "ScaleFL: divide Eq. (5)'s index-weighted sum by sum_i i ('sum', as the "
                                  "authors' code) or by the last exit's index ('last': its CE at weight 1, a control)",
                                  choices=("sum", "last"), added_later=True)


class ScaleFL(Method):
    name = "scalefl"
    summary = "2-D (depth x width) sub-models from a cost search, early exits, KD from the last exit (ScaleFL)"
    defaults = {"scaling": "2d", "aggregation_weights": "uniform"}
    scalings = ("2d",)
    Options = Options

    def plan(self, client, budget, round_index) -> SubModel:
        """The largest level split the client's budget affords (its level's split)."""
        return self.fit(budget)

    def recipe(self, spec: SubModel, round_index: int) -> LastTeacher:
        """Eq. (5): exits weighted by index, the last exit teaching the earlier ones."""
        return LastTeacher(beta=self.options.scalefl_beta, tau=self.options.kd_temperature,
                           normaliser=self.options.scalefl_normaliser)

    def eval_specs(self):
        return self.level_eval_specs()
