"""The server/client seam: physical budgets per client, the family registry, explicit losses."""

import dataclasses

import pytest

from hetfl.config import Config
from hetfl.costs import measure
from hetfl.devices import Budget, Scenario
from hetfl.errors import HetflError
from hetfl.methods import config_from, build_method
from hetfl.models import FAMILIES, FamilyEntry, register_family


def test_a_client_budget_in_bytes_gets_the_deepest_cut_that_fits():
    method = build_method(Config(method="depthfl", model_width=0.25), (1, 28, 28), 10)
    costs = [measure(method.family, method.spec(d), batch_size=32).train_memory for d in (1, 2, 3, 4)]
    assert costs == sorted(costs)
    between = Budget(level=1, memory_bytes=(costs[1] + costs[2]) // 2)  # any device, not a level's budget
    assert method.fit(between).depth == 2
    assert method.fit(Budget(level=1, memory_bytes=costs[3])).depth == 4
    assert method.fit(Budget(level=3)).depth == 3  # a level-only budget: the level's sub-model
    with pytest.raises(HetflError, match="smaller than the smallest sub-model"):
        method.fit(Budget(level=1, memory_bytes=costs[0] - 1))


def test_scenario_gives_each_client_its_levels_physical_budget():
    scenario = Scenario("fixed", 8, [1, 1], seed=0)
    budgets = [Budget(level=1, macs_per_sample=100), Budget(level=2, macs_per_sample=400)]
    scenario.use_budgets(budgets)
    for client in range(8):
        b = scenario.budget(client, 1)
        assert b == budgets[b.level - 1] and b.level == scenario.levels(1)[client]
    with pytest.raises(HetflError, match="one per level"):
        scenario.use_budgets(budgets[:1])


def test_every_registered_family_is_a_config_choice():
    choices = next(f for f in dataclasses.fields(Config) if f.name == "model").metadata["choices"]
    assert set(choices) == set(FAMILIES)
    with pytest.raises(ValueError, match="registered twice"):
        register_family("cnn", FamilyEntry(1, (0,), (1,), lambda *a, **k: None))


@pytest.mark.parametrize("method", ["alllarge", "heterofl", "scalefl", "sheterofl", "decoupled"])
def test_mutual_kd_is_refused_where_a_method_does_not_use_it(method):
    with pytest.raises(HetflError, match="does not use it"):
        build_method(config_from({"method": method, "kd_weight": 1.0}), (1, 28, 28), 10)


def test_losses_are_each_methods_own():
    shape = (1, 28, 28)
    depthfl = build_method(config_from({"method": "depthfl"}), shape, 10)
    spec = depthfl.spec(2)
    rounds = depthfl.cfg.rounds  # the KD weight ramps up over the first 30% of them, then stays at 1
    assert depthfl.recipe(spec, 1).kind == "exits_ce" and 0 < depthfl.recipe(spec, 1).kd_weight < 0.1
    assert depthfl.recipe(spec, rounds).kd_weight == 1.0
    assert build_method(config_from({"method": "alllarge"}), shape, 10).recipe(spec, 1).kd_weight == 0.0
    scalefl = build_method(config_from({"method": "scalefl"}), shape, 10)
    assert scalefl.recipe(scalefl.full_spec(), 1).kind == "last_teacher"
