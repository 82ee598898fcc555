"""Decoupled: a separate model per level, each trained only by that level's clients (ScaleFL Sec. 4).

The global state holds one model per level under the name group ``level{l}/``; the masked mean
therefore averages each level's model over its own clients only.
"""

from dataclasses import replace

from ..aggregation import ServerState
from ..slicing import SubModel
from .base import Method


class Decoupled(Method):
    name = "decoupled"
    summary = "one independent model per level, trained only by that level's clients"

    def level_spec(self, level: int) -> SubModel:
        """Level ``level``'s own model."""
        return replace(super().level_spec(level), group=f"level{level}/", level=level)

    def init_state(self, seed: int) -> ServerState:
        """One seeded model per level, under its group prefix."""
        params = {}
        for level in range(1, self.num_levels + 1):
            params.update(self.initial_params(self.level_spec(level), seed + level))
        return ServerState(params)

    def plan(self, client, budget, round_index) -> SubModel:
        """The model of the client's own level."""
        return self.level_spec(budget.level)

    def eval_specs(self):
        return self.level_eval_specs()
