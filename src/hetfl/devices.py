"""Device budgets: which budget every client has at every round (DESIGN.md, "Budgets are physical").

A scenario assigns each client a level 1..L (L = the most capable device) per round:

* ``fixed``: a seeded assignment with the given proportions, the same every round (DepthFL Table 5).
* ``dynamic``: each round a fresh seeded assignment with the same proportions (DepthFL Table 5).
* ``maximum``: every client has level L (DepthFL Table 5).

Level counts follow the proportions by largest remainder, so every round has exactly the same
number of clients per level. A ``Budget`` also carries physical fields (training memory in bytes,
MACs per sample) that the cost model fills in later; the level is the paper-style discretisation.
``BUDGET_UNITS`` says what a level's budget ratio r means: an index only (``level``), r x the full
model's training memory (``memory``) or MACs per sample (``macs``), or the training memory of the
full-depth model at width r (``width-memory``: FeDepth Sec. 5.1, where r = 1/6 affords the
1/6-width model and r = 2 a model twice as wide).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import HetflError
from .seeding import rng_for

SCENARIOS = ("fixed", "dynamic", "maximum")


@dataclass(frozen=True)
class Budget:
    """What a device can afford this round: its level and, when known, physical limits."""

    level: int
    memory_bytes: int | None = None
    macs_per_sample: int | None = None


def level_counts(num_clients: int, proportions: list[float]) -> list[int]:
    """Clients per level (1..L) for these proportions, by largest remainder; sums to num_clients."""
    p = np.asarray(proportions, dtype=float)
    if p.ndim != 1 or len(p) == 0:
        raise HetflError("proportions must be a list with one entry per level, e.g. 1,1,1,1")
    if (p < 0).any() or not np.isfinite(p).all():
        raise HetflError(f"proportions must be >= 0, got {list(proportions)}")
    if p.sum() <= 0:
        raise HetflError(f"proportions must not sum to zero, got {list(proportions)}")
    exact = p / p.sum() * num_clients
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: num_clients - counts.sum()]:
        counts[i] += 1
    empty = [i + 1 for i, c in enumerate(counts) if c == 0]
    if empty:
        raise HetflError(f"proportions {list(proportions)} give no client to level(s) {empty} of "
                         f"{num_clients} clients; raise those proportions or drop the level")
    return counts.tolist()


class Scenario:
    """The budget of every client at every round."""

    def __init__(self, kind: str, num_clients: int, proportions: list[float], seed: int):
        if kind not in SCENARIOS:
            raise HetflError(f"scenario '{kind}' is unknown; choose one of: {', '.join(SCENARIOS)}")
        self.kind = kind
        self.num_levels = len(proportions)
        self.num_clients = num_clients
        self.counts = level_counts(num_clients, proportions)
        self.seed = seed
        self._fixed = self._assign(rng_for(seed, "levels"))
        self.level_budgets: list[Budget] | None = None  # physical budget of each level, when known

    def use_budgets(self, level_budgets: list[Budget]) -> None:
        """Give every level-l device the physical budget ``level_budgets[l - 1]`` (training memory, MACs)."""
        if len(level_budgets) != self.num_levels:
            raise HetflError(f"{len(level_budgets)} budgets for {self.num_levels} levels; give one per level")
        self.level_budgets = list(level_budgets)

    def _assign(self, rng: np.random.Generator) -> np.ndarray:
        levels = np.repeat(np.arange(1, self.num_levels + 1), self.counts)
        return levels[rng.permutation(self.num_clients)]

    def levels(self, round_index: int) -> np.ndarray:
        """Level (1..L) of every client at this round."""
        if self.kind == "maximum":
            return np.full(self.num_clients, self.num_levels)
        if self.kind == "dynamic":
            return self._assign(rng_for(self.seed, "levels", round_index))
        return self._fixed

    def budget(self, client: int, round_index: int) -> Budget:
        """The budget of ``client`` at ``round_index``: its level, and its level's physical limits when known."""
        level = int(self.levels(round_index)[client])
        return self.level_budgets[level - 1] if self.level_budgets else Budget(level=level)


BUDGET_UNITS = ("level", "memory", "macs", "width-memory")


def level_budgets(unit: str, ratios: list[float], full_cost) -> list[Budget]:
    """One budget per level: ratios[l] x the full model's cost in ``unit`` (training memory or MACs)."""
    return [Budget(level=l,
                   memory_bytes=int(r * full_cost.train_memory) if unit == "memory" else None,
                   macs_per_sample=int(r * full_cost.macs) if unit == "macs" else None)
            for l, r in enumerate(ratios, start=1)]


def width_budgets(ratios: list[float], memory_at_width) -> list[Budget]:
    """One budget per level: the training memory ``memory_at_width(r)`` of the full-depth model at width ratios[l]."""
    return [Budget(level=l, memory_bytes=int(memory_at_width(r))) for l, r in enumerate(ratios, start=1)]


def fits(cost, budget: Budget) -> bool:
    """Whether a sub-model of this cost is within the budget's physical limits."""
    return ((budget.memory_bytes is None or cost.train_memory <= budget.memory_bytes)
            and (budget.macs_per_sample is None or cost.macs <= budget.macs_per_sample))


def describe_budget(budget: Budget) -> str:
    """The budget's limits in words."""
    parts = []
    if budget.memory_bytes is not None:
        parts.append(f"{budget.memory_bytes / 2**20:.2f} MiB of training memory")
    if budget.macs_per_sample is not None:
        parts.append(f"{budget.macs_per_sample / 1e6:.2f} M MACs per sample")
    return " and ".join(parts) or f"level {budget.level}"


def fit_largest(candidates: list, budget: Budget, cost):
    """The candidate sub-model of largest cost (MACs, then parameters) that fits ``budget``."""
    key = lambda spec: (cost(spec).macs, cost(spec).params)  # noqa: E731
    fitting = [c for c in candidates if fits(cost(c), budget)]
    if not fitting:
        smallest = min(candidates, key=key)
        c = cost(smallest)
        raise HetflError(f"a budget of {describe_budget(budget)} is smaller than the smallest sub-model "
                         f"(depth {smallest.depth}, width {smallest.width:g}: {c.train_memory / 2**20:.2f} MiB, "
                         f"{c.macs / 1e6:.2f} M MACs)")
    return max(fitting, key=key)
