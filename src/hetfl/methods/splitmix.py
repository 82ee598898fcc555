"""SplitMix (Hong et al., "Efficient Split-Mix Federated Learning for On-Demand and In-Situ Customization",
ICLR 2022), as FeDepth's baseline under the same measured budgets.

* Split - the wide model is split into K narrow base networks of width 1/K (full depth, no
  parameter shared: ``models.base.BaseEnsemble``); K = 1 / the smallest budget ratio (1/6 in
  FeDepth's Fair and Surplus budgets, so K = 6), or ``splitmix_bases``.
* Local training - a client trains as many bases as its measured training memory affords, each
  with its own cross-entropy (the bases learn independently). hetfl trains them in one step, one
  backward pass over the sum of their CEs, so n bases cost n bases' activations; SplitMix's code
  runs each base's forward and backward one after the other in a step, which needs one base's
  activations, but assigns a client width_budget / base_width bases, what the parallel step's
  memory gives here up to channel rounding. Which bases: SplitMix's Alg. 2 takes the first from a
  shuffled cycle over the bases and the others at random; hetfl draws them all at random per
  (seed, round, client), so every base is trained equally often in expectation and the plan does
  not depend on the order clients are planned in.
* Aggregation - each base averaged over the clients that trained it (sample-weighted, as the
  code's client weights).
* Mix - a device infers with the mean of the logits of the bases it can afford: "global" mixes all
  K bases; "level{l}" mixes the bases a level-l device trains. Every base alone is reported as
  "exit{i}".

Relied on: the SplitMix paper's description as summarised in FeDepth Sec. 3, checked against the
authors' public code (github.com/illidanlab/SplitMix: ``fed_splitmix.py``) for K
(max ratio / base ratio), the number of bases per client (its ratio / base ratio), their selection,
the bases' training (one CE each, their backward passes in turn, one optimizer step) and the mix
(the mean of the bases' logits); none of its code is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..aggregation import ServerState
from ..errors import HetflError
from ..options import Range, opt
from ..seeding import rng_for
from ..slicing import SubModel
from .base import Method
from .options import NoOptions


@dataclass(frozen=True)
class Options(NoOptions):
    """The number of base networks."""

    splitmix_bases: int = opt(0, "SplitMix: number K of base networks, each of width 1/K (0 = 1 / the smallest "
                              "budget ratio, or level width)", valid=Range(0, 64))

    def check(self, cfg) -> None:
        if cfg.exits:
            raise HetflError("SplitMix's bases infer with their last exit; drop --exits")


class SplitMix(Method):
    name = "splitmix"
    summary = "the wide model split into narrow bases; a client trains as many as it affords, inference mixes them"
    Options = Options
    scalings = ("width",)
    defaults = {"scaling": "width", "inference": "ensemble"}

    @classmethod
    def make_family(cls, cfg, input_shape, num_classes):
        """The backbone with its head only: a base infers with its last exit."""
        family = super().make_family(cfg, input_shape, num_classes)
        return family.with_exits((family.arch.num_blocks - 1,))

    @property
    def num_bases(self) -> int:
        """K: ``splitmix_bases``, else 1 / the smallest budget ratio (width-memory budgets) or level width."""
        if self.options.splitmix_bases:
            return self.options.splitmix_bases
        smallest = min(self.cfg.level_budget_ratios if self.cfg.budget == "width-memory" else self.cfg.level_widths)
        return max(1, round(1 / smallest))

    def bases_spec(self, bases) -> SubModel:
        """The given bases, full depth at width 1/K."""
        return SubModel(depth=self.family.arch.num_blocks, width=1 / self.num_bases, bases=tuple(sorted(bases)))

    def candidates(self) -> list[SubModel]:
        """1..K bases (their cost does not depend on which)."""
        return [self.bases_spec(range(n)) for n in range(1, self.num_bases + 1)]

    def full_spec(self) -> SubModel:
        """All K bases: the split wide model."""
        return self.candidates()[-1]

    def init_state(self, seed: int) -> ServerState:
        """K freshly initialised bases (base i seeded with seed + i)."""
        return ServerState(self.initial_params(self.full_spec(), seed))

    def plan(self, client, budget, round_index) -> SubModel:
        """As many bases as the client's budget affords, drawn at random (seeded by round and client)."""
        n = len(self.fit(budget).bases)
        chosen = rng_for(self.cfg.seed, "splitmix-bases", round_index, client).permutation(self.num_bases)[:n]
        return self.bases_spec(int(b) for b in chosen)

    def eval_specs(self):
        specs = {"global": self.full_spec()}
        specs.update({f"level{l}": self.level_spec(l) for l in range(1, self.num_levels)
                      if self.level_spec(l) != specs["global"]})
        return specs

    def budget_report(self) -> dict:
        """The number of bases every level's budget affords."""
        return {"bases per budget": {"header": ["budget", "bases trained", "of"],
                           "rows": [[f"level {l}", str(len(self.level_spec(l).bases)), str(self.num_bases)]
                                    for l in range(1, self.num_levels + 1)]}}
