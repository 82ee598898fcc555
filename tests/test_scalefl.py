"""ScaleFL and 2-D scaling: the Eq. (1) split search (checked against brute force), Table 1 on
ResNet-110, level models with level exits, baselines on the same levels, and the errors."""

import pytest

from hetfl.costs import build, component_costs, count_macs, count_params
from hetfl.errors import HetflError
from hetfl.methods import config_from, build_method
from hetfl.models import model_family
from hetfl.slicing import SubModel
from hetfl.splits import WIDTH_GRID, split_search


def test_component_costs_add_up_to_the_model():
    fam = model_family("cnn", (1, 28, 28), 10)
    stem, blocks, exits = component_costs(fam, 0.5, "macs")
    model = build(fam, SubModel(depth=3, width=0.5, exits=(3,)))
    assert stem + sum(blocks[:3]) + exits[2] == count_macs(model, (1, 28, 28), batch=1)
    stem, blocks, exits = component_costs(fam, 0.5, "params")
    assert stem + sum(blocks[:3]) + exits[2] == count_params(model)


def brute_force(fam, targets, eps, unit, nested=True):
    """Eq. (1) by exhaustion over every depth and grid width, levels in order (Alg. 1 lines 2-5), each level
    at least as deep and wide as the one before when ``nested``."""
    n, placed, found = fam.arch.num_blocks, [], []

    def cost(d, w):
        stem, blocks, exits = component_costs(fam, w, unit)
        return stem + sum(blocks[:d]) + sum(exits[p - 1] for p in placed if p < d) + exits[d - 1]

    for r in targets:
        full = cost(n, 1.0)
        low_d, low_w = found[-1][:2] if found and nested else (1, 0)
        feasible = [(abs(d / n - w), d, w) for d in range(low_d, n + 1)
                    for w in WIDTH_GRID if w >= low_w and abs(cost(d, w) / (r * full) - 1) <= eps + 1e-12]
        diff, d, w = min(feasible)
        found.append((d, w, diff))
        placed += [d] if d not in placed else []
    return found


@pytest.mark.parametrize("unit", ["params", "macs"])
def test_split_search_is_the_most_uniform_feasible_split(unit):
    fam = model_family("preresnet20", (3, 32, 32), 10, exit_after=tuple(range(9)))
    targets = [0.125, 0.25, 0.5, 1.0]
    splits = split_search(fam, targets, [0.1] * 4, unit)
    assert all(s.within_epsilon for s in splits)
    assert (splits[-1].depth, splits[-1].s_w, splits[-1].ratio) == (9, 1.0, 1.0)  # the last level is M itself
    assert [s.depth for s in splits] == sorted(s.depth for s in splits)  # nested: as deep and
    assert [s.s_w for s in splits] == sorted(s.s_w for s in splits)  # at least as wide
    for s, (d, w, diff) in zip(splits, brute_force(fam, targets, 0.1, unit)):
        assert abs(s.s_d - s.s_w) == pytest.approx(diff)


def test_unnested_split_is_feasible_where_the_nested_one_is_not():
    """The ViT's level 3 (50% of the MACs): no split at least as deep and wide as level 2's is within 10%,
    Eq. (1)'s unconstrained argmin is, shallower than level 2 but wider."""
    from hetfl.errors import HetflError

    fam = model_family("vit", (1, 28, 28), 10, exit_after=tuple(range(6)))
    targets = [0.125, 0.25, 0.5, 1.0]
    with pytest.raises(HetflError, match="level 3 .* or set split_nested = false"):
        split_search(fam, targets, [0.1] * 4, "macs")
    splits = split_search(fam, targets, [0.1] * 4, "macs", nested=False)
    assert all(s.within_epsilon for s in splits)
    assert splits[2].depth < splits[1].depth and splits[2].s_w > splits[1].s_w  # not nested
    for s, (d, w, diff) in zip(splits, brute_force(fam, targets, 0.1, "macs", nested=False)):
        assert abs(s.s_d - s.s_w) == pytest.approx(diff)


def test_resnet110_split_reproduces_scalefl_table1_level1():
    """Table 1, level 1: (s_d, s_w) = (0.66, 0.70), 0.21 M params, 83.4 M FLOPs (our MACs) at r = 12.5%."""
    cfg = config_from({"method": "scalefl", "model": "resnet110", "dataset": "cifar10", "split_cost": "params"})
    method = build_method(cfg, (3, 32, 32), 10)
    level1 = method.splits[0]
    assert level1.depth == 36 and level1.s_w == pytest.approx(0.67)  # s_d = 36 / 54 = 0.667
    model = build(method.family, method.level_spec(1))
    assert round(count_params(model) / 1e6, 2) == 0.21
    assert round(count_macs(model, (3, 32, 32)) / 1e6, 1) == 83.4
    assert [s.within_epsilon for s in method.splits] == [True] * 4


def test_level_models_hold_exactly_the_exits_of_their_level_and_below():
    cfg = config_from({"method": "scalefl", "model": "preresnet20", "dataset": "cifar10"})
    method = build_method(cfg, (3, 32, 32), 10)
    assert len({s.depth for s in method.splits}) == 4  # four distinct cuts on this 9-block backbone
    for level in (1, 2, 3, 4):
        model = method.models.module(method.level_spec(level))
        assert model.exit_numbers == tuple(range(1, level + 1))
        assert model.exit_after[-1] == method.splits[level - 1].depth - 1  # exit l after block floor(s_d N)


@pytest.mark.parametrize("baseline", ["allsmall", "decoupled", "exclusivefl"])
def test_baselines_with_2d_scaling_train_scalefls_level_models(baseline):
    scalefl = build_method(config_from({"method": "scalefl"}), (1, 28, 28), 10)
    other = build_method(config_from({"method": baseline, "scaling": "2d"}), (1, 28, 28), 10)
    for level in (1, 2, 3, 4):
        a, b = scalefl.level_spec(level), other.level_spec(level)
        assert (a.depth, a.width, a.exits) == (b.depth, b.width, b.exits)


def test_scalefl_trains_digits_with_local_accuracy(tiny_cfg):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="scalefl", rounds=3, client_fraction=0.5, model_width=0.5,
                              client_test_fraction=0.2))
    specs = [sim.method.level_spec(l) for l in (1, 2, 3, 4)]
    assert [s.depth for s in specs] == sorted(s.depth for s in specs) and specs[-1].width == 1.0
    summary = sim.run(progress=False)
    assert set(summary["final"]) == {"global", "level1", "level2", "level3"}
    assert 0 <= summary["local_accuracy"] <= 1 and summary["accuracy"] > 0.3


def test_scalefl_bad_input():
    with pytest.raises(HetflError, match="the last budget ratio must be 1"):
        config_from({"method": "scalefl", "budget_ratios": [0.1, 0.2, 0.4, 0.8]}).validate()
    with pytest.raises(HetflError, match="split_epsilon must be > 0"):
        config_from({"method": "scalefl", "split_epsilon": [0]}).validate()
    with pytest.raises(HetflError, match="split_epsilon must be > 0, one value or one per level"):
        config_from({"method": "scalefl", "split_epsilon": [0.1, 0.1]}).validate()
    with pytest.raises(HetflError, match="no 2-D split of cnn for level 1 is within split_epsilon 0.001"):
        build_method(config_from({"method": "scalefl", "split_epsilon": [0.001],
                                       "budget_ratios": [0.0001, 0.25, 0.5, 1.0]}), (1, 28, 28), 10)
    with pytest.raises(HetflError, match="method 'scalefl' cuts its sub-models by 2d, not by scaling 'depth'"):
        build_method(config_from({"method": "scalefl", "scaling": "depth"}), (1, 28, 28), 10)


def test_exit_every_is_not_used_by_2d_scaling_and_says_so(capsys):
    """A table gives every method the same exit_every; ScaleFL keeps an exit at each level's cut (Alg. 1)."""
    method = build_method(config_from({"method": "scalefl", "model": "preresnet20", "dataset": "cifar10",
                                       "exit_every": 1}), (3, 32, 32), 10)
    cuts = tuple(sorted({s.depth - 1 for s in method.splits}))
    assert method.family.arch.exit_after == cuts and len(cuts) < method.family.arch.num_blocks
    warning = capsys.readouterr().err
    assert "--exit-every 1" in warning and "is not used" in warning and f"{[c + 1 for c in cuts]}" in warning
