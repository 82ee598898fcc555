"""SplitMix (FeDepth's baseline): a wide model split into narrow bases, as many trained as a budget affords, mixed."""

import torch

from hetfl.costs import measure
from hetfl.methods import build_method, config_from
from hetfl.slicing import SubModel

FAIR = [1 / 6, 1 / 3, 1 / 2, 1.0]


def splitmix(**changes):
    cfg = config_from({"method": "splitmix", "model": "preresnet20", "budget": "width-memory", "budget_ratios": FAIR,
                       **changes})
    return build_method(cfg, (1, 8, 8), 10)


def test_a_client_trains_as_many_bases_as_its_measured_budget_affords():
    method = splitmix()
    assert method.num_bases == 6 and method.full_spec().width == 1 / 6
    cost = lambda n: measure(method.family, method.bases_spec(range(n)), 32).train_memory  # noqa: E731
    counts = [len(method.level_spec(l).bases) for l in (1, 2, 3, 4)]
    assert counts[0] == 1 and counts == sorted(counts)
    for budget, n in zip(method.level_budgets, counts):
        assert cost(n) <= budget.memory_bytes and (n == 6 or cost(n + 1) > budget.memory_bytes)
    assert cost(2) > 1.9 * cost(1)  # the bases train in one step: n bases, n bases' activations


def test_bases_are_drawn_per_round_and_client_and_every_base_gets_trained():
    method = splitmix()
    budget = method.level_budgets[2]
    n = len(method.fit(budget).bases)
    drawn = [method.plan(c, budget, 1).bases for c in range(30)]
    assert all(len(set(b)) == len(b) == n for b in drawn)
    assert method.plan(3, budget, 1) == method.plan(3, budget, 1) and {b for bs in drawn for b in bs} == set(range(6))


def test_the_split_model_mixes_its_bases_and_aggregates_each_over_its_trainers(tiny_cfg):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="splitmix", model="preresnet20", model_width=1.0, budget="width-memory",
                              budget_ratios=FAIR, rounds=1))
    before = {k: v.clone() for k, v in sim.state.params.items()}
    assert not torch.equal(before["base0.stem.0.weight"], before["base1.stem.0.weight"])  # seeded apart
    trained = set()
    for client in sim.sample_clients(1):
        trained |= set(sim.method.plan(client, sim.scenario.budget(client, 1), 1).bases)
    sim.run(progress=False)
    for b in range(6):
        key = f"base{b}.blocks.0.conv1.weight"
        moved = not torch.equal(sim.state.params[key], before[key])
        assert moved == (b in trained), b
    model = sim.method.models.module(sim.method.full_spec())
    logits = model(sim.x_test[:5])
    assert len(logits) == 6 and sim.method.predict(logits).shape == (5, 10)
    assert torch.allclose(sim.method.predict(logits), torch.stack(logits).mean(0))  # the mix: mean of the logits
    assert set(sim.history[-1]["eval"]["global"]) >= {f"exit{i}" for i in range(1, 7)} | {"ensemble"}


def test_a_spec_of_bases_round_trips():
    spec = SubModel(depth=9, width=1 / 6, bases=(1, 4))
    assert SubModel.from_dict(spec.to_dict()) == spec
