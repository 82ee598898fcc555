"""InclusiveFL's two-stage aggregation and momentum distillation, checked by hand (Alg. 1)."""

import pytest
import torch
from torch import nn

from hetfl.client import Update
from hetfl.methods import config_from
from hetfl.errors import HetflError
from hetfl.methods.inclusivefl import InclusiveFL, InclusiveFLWithoutMD
from hetfl.models import ArchSpec, ModelFamily, MultiExitModel, model_family


def linear_builder(input_shape, num_classes, *, width, depth, norm):
    """Three identical blocks Linear(2, 2) and exits Linear(2, 2), no biases."""
    blocks = [nn.Linear(2, 2, bias=False) for _ in range(depth)]
    exits = [nn.Linear(2, num_classes, bias=False) for _ in range(depth)]
    return MultiExitModel(nn.Identity(), blocks, exits, tuple(range(depth)))


def make(md_beta=0.0, server_opt="fedavg", **options):
    family = ModelFamily("linear", (2, 1, 1), 2, ArchSpec(3, (0, 1, 2)), linear_builder)
    cfg = config_from({"method": "inclusivefl", "levels": 3, "md_beta": md_beta, "server_opt": server_opt,
                            "num_clients": 10, **options})
    method = InclusiveFL(cfg, family, num_levels=3)
    return method, method.init_state(seed=0)


def update(method, level, value_of):
    """A client update of ``level`` whose every tensor is filled by value_of(name)."""
    spec = method.level_spec(level)
    state = {n: torch.full(s, float(value_of(n))) for n, s in method.models.shapes(spec).items()}
    return Update(client=0, spec=spec, state=state, num_samples=10)


def test_layout_shared_and_isolated_names():
    method, state = make()
    g = state.params
    assert method.level_spec(1).exits == (1,) and method.level_spec(3).exits == (3,)
    assert {"level1/blocks.0.weight", "level1/exits.0.weight", "level2/blocks.1.weight", "level2/exits.1.weight",
            "blocks.0.weight", "blocks.1.weight", "blocks.2.weight", "exits.2.weight"} == set(g)
    assert torch.equal(g["level1/blocks.0.weight"], g["blocks.0.weight"])  # same initialisation (Alg. 1 line 2)


def test_two_stage_aggregation_by_hand():
    """FedAvg per level (lr 1): the level means; then shared layers averaged by client counts n_j."""
    method, g = make()
    ups = [update(method, 1, lambda n: 1.0),
           update(method, 2, lambda n: 2.0), update(method, 2, lambda n: 4.0),  # level-2 mean: 3
           update(method, 3, lambda n: 6.0)]
    new = method.aggregate(g, iter(ups)).params
    full = lambda v: torch.full((2, 2), v)
    assert torch.allclose(new["level1/blocks.0.weight"], full(1.0))  # isolated: level 1's own mean
    assert torch.allclose(new["level1/exits.0.weight"], full(1.0))
    assert torch.allclose(new["blocks.0.weight"], full((2 * 3.0 + 1 * 6.0) / 3))  # shared by levels 2, 3 (line 27)
    assert torch.allclose(new["level2/blocks.1.weight"], full(3.0))
    assert torch.allclose(new["blocks.1.weight"], full(6.0))  # only level 3 holds it as shared
    assert torch.allclose(new["exits.2.weight"], full(6.0))


def test_a_level_without_clients_keeps_its_isolated_module():
    method, g = make()
    new = method.aggregate(g, iter([update(method, 3, lambda n: 5.0)])).params
    assert torch.equal(new["level1/blocks.0.weight"], g.params["level1/blocks.0.weight"])
    assert torch.allclose(new["blocks.0.weight"], torch.full((2, 2), 5.0))


def test_momentum_distillation_by_hand():
    """beta = 0.5: round 2's level-1 top-block update = 0.5 m^2_1 + 0.5 g^1, m^2_1 = mean of g^2 over blocks 0..1.

    m_0 = 0 (Alg. 1 line 1): a top-block update with no momentum from above yet is scaled by 1 - beta.
    """
    beta = 0.5
    method, g = make(md_beta=beta)
    w = {k: v.clone() for k, v in g.params.items()}
    # round 1: only level 2 trains; its block 0 moves by +1, its top block 1 by +3, mixed with m^3 = 0 into
    # 0.5 * 0 + 0.5 * 3 = 1.5 (line 17) -> m^2 = mean(+1, +1.5) = +1.25 (line 22)
    r1 = update(method, 2, lambda n: 0.0)
    r1.state = {n: w[n if n.startswith("blocks.0") else "level2/" + n] + (1.0 if n.startswith("blocks.0") else 3.0)
                for n in r1.state}
    g1 = method.aggregate(g, iter([r1]))
    m = g1.extra["level2/weight"]  # m^2_1, carried in the server state
    assert torch.allclose(m, torch.full((2, 2), 1.25))
    assert torch.allclose(g1.params["level2/blocks.1.weight"], w["level2/blocks.1.weight"] + 1.5)
    # round 2: only level 1 trains, its top block (block 0) moves by +4: mixed update 0.5 * 1.25 + 0.5 * 4
    r2 = update(method, 1, lambda n: 0.0)
    r2.state = {n: g1.params["level1/" + n] + 4.0 for n in r2.state}
    g2 = method.aggregate(g1, iter([r2]))
    assert torch.allclose(g2.params["level1/blocks.0.weight"],
                          g1.params["level1/blocks.0.weight"] + beta * 1.25 + (1 - beta) * 4.0)
    assert torch.allclose(g2.params["level1/exits.0.weight"], g1.params["level1/exits.0.weight"] + 4.0)  # head unmixed
    assert "level2/weight" not in g2.extra  # level 2 sat round 2 out: its momentum is zero


def test_momentum_distillation_refused_on_unequal_blocks():
    fam = model_family("cnn", (1, 28, 28), 10)
    cfg = config_from({"method": "inclusivefl", "levels": 4})
    with pytest.raises(HetflError, match="momentum distillation needs blocks of identical shapes"):
        InclusiveFL(cfg, fam, num_levels=4)
    InclusiveFL(config_from({"method": "inclusivefl-womd", "levels": 4}), fam, num_levels=4)  # w/o MD runs


def test_fedadam_state_is_per_level():
    method, g = make(server_opt="fedadam")
    keys = set(method.aggregate(g, iter([update(method, 1, lambda n: 1.0), update(method, 3, lambda n: 1.0)])).opt)
    assert "m/level1/blocks.0.weight" in keys and "m/level3/blocks.0.weight" in keys


def test_inclusivefl_without_md_learns_digits_end_to_end(tiny_cfg):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="inclusivefl-womd", model="cnn", server_opt="fedavg", rounds=6,
                              client_fraction=0.5, model_width=0.5))
    summary = sim.run(progress=False)
    assert set(summary["final"]) == {"global", "level1", "level2", "level3"}
    assert set(summary["final"]["level2"]) == {"exit2", "ensemble", "loss"}
    assert summary["accuracy"] > 0.5


def test_inclusivefl_with_momentum_distillation_runs_on_the_vit(tiny_cfg):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="inclusivefl", model="vit", model_width=1.0, levels=3, rounds=4,
                              client_fraction=0.5))
    assert sim.cfg.method_options["md_beta"] == 0.2 and sim.cfg.server_opt == "fedadam"
    assert sim.method.server.lr == 1e-2  # FedAdam's own eta, not FedAvg's 1 (which diverges)
    summary = sim.run(progress=False)
    assert set(summary["final"]) == {"global", "level1", "level2"}
    assert sim.state.extra  # momentum was distilled
    assert summary["accuracy"] > 0.4  # 10 classes: chance is 0.1


def test_cross_level_weights_are_clients_or_samples():
    """Alg. 1 line 7: n_j = the number of users of group j; with sample weights, the group's samples."""
    method, g = make()
    ups = [update(method, 2, lambda n: 2.0), update(method, 3, lambda n: 6.0)]
    ups[0].num_samples, ups[1].num_samples = 30, 10
    new = method.aggregate(g, iter(ups)).params
    assert torch.allclose(new["blocks.0.weight"], torch.full((2, 2), (2.0 + 6.0) / 2))  # one client each
    method, g = make(aggregation_weights="samples")
    ups = [update(method, 2, lambda n: 2.0), update(method, 3, lambda n: 6.0)]
    ups[0].num_samples, ups[1].num_samples = 30, 10
    new = method.aggregate(g, iter(ups)).params
    assert torch.allclose(new["blocks.0.weight"], torch.full((2, 2), (30 * 2.0 + 10 * 6.0) / 40))


def test_inclusivefl_refuses_an_md_beta_without_md_and_levels_of_one_depth():
    fam = model_family("vit", (1, 28, 28), 10)
    with pytest.raises(HetflError, match="inclusivefl-womd runs without momentum distillation"):
        InclusiveFLWithoutMD(config_from({"method": "inclusivefl-womd", "md_beta": 0.3, "levels": 3}), fam, 3)
    cfg = config_from({"method": "inclusivefl", "levels": 3, "budget": "macs", "budget_ratios": [0.9, 0.95, 1.0]})
    with pytest.raises(HetflError, match="InclusiveFL needs a different depth per level"):
        InclusiveFL(cfg, fam, 3).fit_budgets()
