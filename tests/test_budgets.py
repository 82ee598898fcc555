"""Physical budgets: each level gets ratio x the full model's cost; a method fits the largest sub-model."""

from dataclasses import dataclass

import pytest

from hetfl.config import Config
from hetfl.methods import config_from
from hetfl.devices import Budget, fit_largest, level_budgets
from hetfl.errors import HetflError
from hetfl.methods.depthfl import DepthFL
from hetfl.methods.heterofl import HeteroFL
from hetfl.models import model_family


@dataclass(frozen=True)
class FakeCost:
    params: int
    macs: int
    train_memory: int


def fake_cost(spec):
    """Cost grows with depth and with width squared: easy to reason about by hand."""
    units = spec.depth * round(16 * spec.width**2)
    return FakeCost(params=units * 10, macs=units * 100, train_memory=units * 1000)


def test_level_budgets_scale_the_full_cost():
    full = FakeCost(params=10, macs=1000, train_memory=2000)
    b = level_budgets("macs", [0.25, 1.0], full)
    assert b == [Budget(1, None, 250), Budget(2, None, 1000)]
    assert level_budgets("memory", [0.5], full) == [Budget(1, 1000, None)]


def test_depthfl_fits_the_deepest_cut_within_each_budget():
    fam = model_family("cnn", (1, 28, 28), 10)
    method = DepthFL(config_from({"method": "depthfl"}), fam, num_levels=4)
    full = fake_cost(method.candidates()[-1])  # depth 4, width 1: 64 units
    method.use_budgets(level_budgets("macs", [0.3, 0.5, 0.8, 1.0], full), fake_cost)
    # budgets 0.3/0.5/0.8/1 of 6400 MACs; depth d costs 1600 d -> depths 1, 2, 3, 4
    assert [method.level_spec(l).depth for l in (1, 2, 3, 4)] == [1, 2, 3, 4]
    method.use_budgets(level_budgets("macs", [0.3, 0.3, 0.6, 1.0], full), fake_cost)
    assert [method.level_spec(l).depth for l in (1, 2, 3, 4)] == [1, 1, 2, 4]


def test_heterofl_fits_the_widest_width():
    fam = model_family("cnn", (1, 28, 28), 10)
    method = HeteroFL(config_from({"method": "heterofl"}), fam, num_levels=4)
    full = fake_cost(method.candidates()[-1])
    method.use_budgets(level_budgets("memory", [0.1, 0.3, 0.6, 1.0], full), fake_cost)
    # width w costs 4 * round(16 w^2) units of 64: 0.25 -> 1/16, 0.5 -> 1/4, 0.75 -> 9/16, 1 -> 1
    assert [method.level_spec(l).width for l in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]


def test_budget_below_the_smallest_sub_model_is_an_error():
    fam = model_family("cnn", (1, 28, 28), 10)
    method = DepthFL(config_from({"method": "depthfl"}), fam, num_levels=4)
    with pytest.raises(HetflError, match="smaller than the smallest sub-model \\(depth 1, width 1"):
        fit_largest(method.candidates(), Budget(1, memory_bytes=10), fake_cost)


@pytest.mark.parametrize("ratios,fragment", [([0.5, 0.25, 0.75, 1], "must increase"), ([0, 0.5, 0.75, 1], "must be > 0")])
def test_bad_budget_ratios(ratios, fragment):
    with pytest.raises(HetflError, match=f"budget_ratios {fragment}"):
        Config(budget="macs", budget_ratios=ratios).validate()


def test_simulation_fits_depths_to_measured_mac_budgets(tiny_cfg):
    from hetfl.costs import measure
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="depthfl", budget="macs", budget_ratios=[0.05, 0.5, 0.9, 1.0]))
    fam = sim.method.family
    macs = [measure(fam, c, 16).macs for c in sim.method.candidates()]
    for level, ratio in zip((1, 2, 3, 4), (0.05, 0.5, 0.9, 1.0)):
        depth = sim.method.level_spec(level).depth
        assert macs[depth - 1] <= ratio * macs[-1]
        assert depth == 4 or macs[depth] > ratio * macs[-1]  # the next deeper cut would not fit


def test_a_level_no_client_holds_still_gets_a_clean_budget_error(tiny_cfg):
    """Maximum: every client is at the top level; a too-small level-1 budget is named by its level."""
    from hetfl.sim import Simulation

    with pytest.raises(HetflError, match=r"^level 1: a budget of .* is smaller than the smallest sub-model"):
        Simulation(tiny_cfg(method="depthfl", scenario="maximum", budget="memory",
                            budget_ratios=[0.001, 0.5, 0.9, 1.0]))
