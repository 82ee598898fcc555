"""ExclusiveFL: only clients whose budget fits the chosen global level take part.

DepthFL Table 2's "exclusive learning": "100% (a)" is the level-1 model trained by every client,
"25% (d)" the level-4 (full) model trained by the 25% of clients that afford it; clients of a
level below g are left out (InclusiveFL Sec. 4.1, "ExclusiveFL"). To compare it with a method,
train and test it the same way (e.g. DepthFL: ``--server-opt feddyn --kd-weight 1
--inference ensemble``). With FedDyn, the federation is the eligible clients: its N (Alg. 1 of
Acar et al.) counts them only, as the DepthFL authors' exclusive runs do.
"""

from dataclasses import dataclass

from ..devices import level_counts
from ..errors import HetflError
from ..options import Range, opt
from ..slicing import SubModel
from ..recipes import ExitsCE
from .base import Method
from .options import MutualKD


@dataclass(frozen=True)
class Options(MutualKD):
    """The global level, and DepthFL Eq. (1)'s mutual KD for runs trained like DepthFL."""

    global_level: int = opt(0, "ExclusiveFL: level of the global model, 1..levels (0 = the largest)",
                           valid=Range(0))

    def check(self, cfg) -> None:
        super().check(cfg)
        if not 0 <= self.global_level <= cfg.levels:
            raise HetflError(f"global_level must be in 1..{cfg.levels} (or 0 = the largest), got {self.global_level}")


class ExclusiveFL(Method):
    name = "exclusivefl"
    summary = "only clients that can afford the global level's model train it; the rest are left out"
    Options = Options

    def federation_size(self) -> int:
        """FedDyn's N: the clients that can take part."""
        return self.eligible_clients()

    def eligible_clients(self) -> int:
        """Clients whose level affords the global level's model (every round the same number)."""
        if self.cfg.scenario == "maximum":
            return self.cfg.num_clients
        return sum(level_counts(self.cfg.num_clients, self.cfg.level_proportions)[self.global_level - 1:])

    @property
    def global_level(self) -> int:
        """The level whose model is the global model (config ``global_level``, default the largest)."""
        return self.options.global_level or self.num_levels

    def global_spec(self) -> SubModel:
        """The global level's model."""
        return self.level_spec(self.global_level)

    def plan(self, client, budget, round_index) -> SubModel | None:
        """The global level's model for clients that can afford it, None for the others."""
        return self.global_spec() if budget.level >= self.global_level else None

    def recipe(self, spec: SubModel, round_index: int) -> ExitsCE:
        """The loss of the method it is compared with: CE over the exits (+ DepthFL Eq. (1)'s mutual KD)."""
        return ExitsCE(kd_weight=self.options.kd_weight_at(round_index, self.cfg.rounds))

    def eval_specs(self):
        return {"global": self.global_spec()}
