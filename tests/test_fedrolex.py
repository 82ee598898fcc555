"""FedRolex: the rolling window worked by hand, the general slicing rule (offset 0 = the leading corner), a Task
carrying its window, FedDyn's state on a wrapped window, and a short digits run."""

import json
from dataclasses import replace

import pytest
import torch

from hetfl.aggregation import FedAvgServer, MaskedMean, ServerState
from hetfl.client import client_update
from hetfl.devices import Budget
from hetfl.errors import HetflError
from hetfl.methods import config_from
from hetfl.methods.fedrolex import FedRolex, window_offset
from hetfl.models import model_family
from hetfl.recipes import ExitsCE
from hetfl.slicing import SubModel, corner, extract, is_view, scatter, window
from hetfl.task import FamilySpec, Task, TrainOptions
from hetfl.trainers.schedule import ClientData


def make(**cfg):
    fam = model_family("cnn", (1, 8, 8), 10, width=1 / 16)  # global channels 4/8/16/32
    method = FedRolex(config_from({"method": "fedrolex", **cfg}), fam, num_levels=cfg.get("levels", 4))
    return method, method.init_state(seed=0).params


def test_window_of_a_5_channel_layer_at_r_0_6_rolls_one_index_per_round_and_wraps():
    """Local size 3 of 5; round t starts at t - 1 (round 1 is HeteroFL's leading corner)."""
    channels = torch.arange(5)
    got = [channels[window((5,), (3,), window_offset(t))].tolist() for t in range(1, 7)]
    assert got == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1], [0, 1, 2]]
    # a conv weight 5 -> 5 at r = 0.6: output and input channels share the window; kernel dims stay whole
    w = torch.arange(5 * 5 * 2).view(5, 5, 2)
    local = w[window(w.shape, (3, 3, 2), window_offset(4))]
    assert torch.equal(local, w[[3, 4, 0]][:, [3, 4, 0]])


def test_plan_gives_the_level_width_in_the_rounds_window():
    method, _ = make()
    for t in (1, 2, 7):
        specs = [method.plan(0, Budget(level=l), t) for l in (1, 2, 3, 4)]
        assert [s.width for s in specs] == [0.25, 0.5, 0.75, 1.0]
        assert {s.offset for s in specs} == {t - 1}
        assert all(replace(s, offset=0) == method.fit(Budget(level=l)) for l, s in zip((1, 2, 3, 4), specs))
    assert list(method.eval_specs()) == ["global", "width0.25", "width0.5", "width0.75"]
    assert all(s.offset == 0 for s in method.eval_specs().values())  # leading-corner widths and the full model


def test_extract_scatter_round_trip_with_a_wrapped_window_by_hand():
    """Global (4, 3): rows sliced to 2 at offset 3 -> rows 3, 0; the 3 columns (say, classes) stay whole."""
    g = {"w": torch.arange(12.0).view(4, 3)}
    spec = SubModel(depth=1, width=0.5, offset=3)
    local = extract(g, {"w": torch.Size([2, 3])}, spec)
    assert local["w"].tolist() == [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
    value, mask = scatter(local, g, spec)["w"]
    assert mask.tolist() == [[True] * 3, [False] * 3, [False] * 3, [True] * 3]
    assert torch.equal(value, torch.where(mask, g["w"], torch.zeros(())))
    local["w"] += 100  # a trained update lands back where it came from
    value, _ = scatter(local, g, spec)["w"]
    assert value[3].tolist() == [109.0, 110.0, 111.0] and value[0].tolist() == [100.0, 101.0, 102.0]


def test_masked_mean_of_two_clients_with_overlapping_rolled_windows_by_hand():
    """Global 4 x 4 of 9s, round offset 3. A: local 3 x 3 of 1s, weight 3 -> rows/cols {3, 0, 1}.
    B: local 2 x 2 of 4s, weight 1 -> rows/cols {3, 0}. Row or column 2 is held by nobody."""
    g = {"w": torch.full((4, 4), 9.0)}
    agg = MaskedMean(g)
    agg.add({"w": torch.ones(3, 3)}, 3.0, SubModel(depth=1, width=0.75, offset=3))
    agg.add({"w": torch.full((2, 2), 4.0)}, 1.0, SubModel(depth=1, width=0.5, offset=3))
    new = FedAvgServer().step(ServerState(g), agg).params["w"]
    both, a = (3 * 1 + 1 * 4) / 4, 1.0
    expected = torch.tensor([[both, a, 9, both],
                             [a, a, 9, a],
                             [9, 9, 9, 9],
                             [both, a, 9, both]])
    assert torch.allclose(new, expected)
    assert agg.weights["w"].tolist() == [[4, 3, 0, 4], [3, 3, 0, 3], [0, 0, 0, 0], [4, 3, 0, 4]]


def test_offset_zero_is_exactly_the_leading_corner():
    method, g = make()
    spec = method.width_spec(0.5)
    shapes = method.models.shapes(spec)
    assert spec.offset == 0
    local = extract(g, shapes, spec)
    for name, shape in shapes.items():
        assert window(g[name].shape, shape, 0) == corner(shape)
        assert torch.equal(local[name], g[name][corner(shape)])
    for name, (value, mask) in scatter(local, g, spec).items():
        inside = corner(local[name].shape)
        assert torch.equal(value[inside], local[name]) and bool(mask[inside].all())
        assert int(mask.sum()) == local[name].numel()
    # a window that does not wrap is still plain slicing (a view), and an offset of a whole turn is the corner
    assert is_view(window((8, 4), (4, 4), 3)) and window((8, 4), (4, 4), 3) == (slice(3, 7), slice(0, 4))
    assert window((5,), (3,), 5) == corner((3,))
    assert not is_view(window((5,), (3,), 3))


def test_model_cache_builds_one_module_per_width_not_per_window():
    method, _ = make()
    spec = method.plan(0, Budget(level=2), 1)
    assert method.models.module(spec) is method.models.module(method.plan(0, Budget(level=2), 5))


def test_task_json_round_trip_keeps_the_window_and_old_specs_read_as_leading_corners():
    spec = SubModel(depth=4, width=0.5, exits=(4,), offset=6)
    task = Task(spec=spec, family=FamilySpec("cnn", (1, 8, 8), 10), loss=ExitsCE(), train=TrainOptions(), lr=0.1,
                round=7, client=3, seed=0, scaler=True)
    back = Task.from_json(task.to_json())
    assert back == task and back.spec.offset == 6
    old = json.loads(task.to_json())
    del old["spec"]["offset"]  # a task written before offsets existed
    assert Task.from_json(json.dumps(old)).spec == replace(spec, offset=0)


def test_configure_sends_the_window_and_bytes_count_only_local_tensors():
    method, g = make()
    task, local = method.configure(ServerState(g), 0, Budget(level=2), 4)
    assert task.spec.offset == 3
    shapes = method.models.shapes(task.spec)
    assert {n: t.shape for n, t in local.items()} == shapes
    w = g["blocks.1.0.weight"]  # conv 4 -> 8 global, 2 -> 4 local: out rows {3, 4, 5, 6}, in channels {3, 0}
    assert torch.equal(local["blocks.1.0.weight"], w[[3, 4, 5, 6]][:, [3, 0]])


def test_feddyn_client_state_follows_the_wrapped_window(tiny_cfg):
    """A width-0.5 client in round 15 (16 -> 8 channels from index 14: wrapped) reads and updates only its window
    of its global-shaped g_k."""
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="fedrolex", server_opt="feddyn", scaler=False))
    task, local = sim.method.configure(sim.state, 0, Budget(level=2), 15)
    g = torch.Generator().manual_seed(0)
    own = {k: torch.randn(shape, generator=g) for k, shape in task.state_shapes.items()}
    update, new_own = client_update(local, task, ClientData(sim.x_train, sim.y_train, sim.parts[0]), own,
                                    models=sim.method.models)
    alpha, wrapped = task.train.feddyn_alpha, 0
    for name, start in local.items():
        key = task.spec.global_name(name)
        if key not in own:
            continue
        inside = window(own[key].shape, start.shape, task.spec.offset)
        want = own[key][inside] - alpha * (update.state[name] - start)  # Acar et al., Alg. 1
        assert torch.allclose(new_own[key][inside], want, atol=1e-6), key
        outside = torch.ones_like(own[key], dtype=torch.bool)
        outside[inside] = False
        assert torch.equal(new_own[key][outside], own[key][outside]), key
        wrapped += not is_view(inside)
    assert wrapped > 0


def test_batched_executor_trains_rolled_windows_as_the_sequential_one(tiny_cfg):
    """Round 15 wraps the windows (16 -> 8 channels from index 14); FedDyn's per-client state follows them in a
    stack too."""
    from hetfl.executors.batched import BatchedExecutor
    from hetfl.sim import Simulation

    sims = []
    for executor in ("sequential", "batched"):
        sim = Simulation(tiny_cfg(method="fedrolex", server_opt="feddyn", executor=executor, client_fraction=0.5,
                                  name=executor))
        sim.create_run_dir()  # what ``run`` does before its rounds
        sim.executor.prepare()
        sim.run_round(15)
        sims.append(sim)
    sequential, batched = sims
    assert isinstance(batched.executor, BatchedExecutor) and max(batched.executor.group_sizes) > 1  # it stacked
    changed = 0
    for name, value in sequential.state.params.items():
        assert (value - batched.state.params[name]).abs().max() <= 1e-4, name
        changed += not torch.equal(value, sequential.method.init_state(0).params[name])
    assert changed > 0


def test_fedrolex_refuses_backbones_with_attention_heads():
    fam = model_family("vit", (1, 28, 28), 10)
    with pytest.raises(HetflError, match="attention heads"):
        FedRolex(config_from({"method": "fedrolex", "model": "vit"}), fam, num_levels=4)


def test_fedrolex_learns_digits(tiny_cfg):
    from hetfl.sim import Simulation

    summary = Simulation(tiny_cfg(method="fedrolex", rounds=6, client_fraction=0.5, model_width=0.5,
                                  client_test_fraction=0.2)).run(progress=False)
    assert set(summary["final"]) == {"global", "width0.25", "width0.5", "width0.75"}
    assert summary["accuracy"] > 0.5


@pytest.mark.parametrize("name", ["preresnet20", "resnet18"])
def test_a_rolled_resnet_sub_model_is_the_global_model_with_every_weight_outside_its_window_zeroed(name):
    """Through residual shortcuts (identity and 1x1 projections) and the head: the width-1/2 sub-model at a window
    that wraps gives the logits of the full-width global model whose every element outside the window is 0 (a zeroed
    channel stays 0 through batch statistics, ReLU and every shortcut). Evaluation mode: the Scaler is off."""
    family = model_family(name, (3, 8, 8), 10, width=1 / 4)  # preresnet20: 4/8/16 channels, resnet18: 16 .. 128
    method = FedRolex(config_from({"method": "fedrolex", "model": name}), family, num_levels=4)
    spec = method.plan(0, Budget(level=2), 128)  # width 1/2 from index 127: it wraps in every layer (4-128 channels)
    assert spec.width == 0.5 and spec.offset == 127
    g = torch.Generator().manual_seed(0)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in method.init_state(seed=0).params.items()}
    local = extract(params, method.models.shapes(spec), spec)
    sliced = [n for n, t in local.items() if t.shape != params[n].shape]
    assert any("shortcut" in n for n in sliced) and all(not is_view(window(params[n].shape, local[n].shape, 127))
                                                        for n in sliced)
    zeroed = {k: torch.where(mask, value, torch.zeros(())) for k, (value, mask) in scatter(local, params, spec).items()}
    x = torch.randn(4, 3, 8, 8, generator=g)
    sub = method.models.loaded(spec, local).eval()(x)[-1]
    full = method.models.loaded(method.full_spec(), zeroed).eval()(x)[-1]
    assert torch.allclose(sub, full, atol=1e-5)
    whole = {n: params[n] for n in method.models.shapes(method.full_spec())}
    assert not torch.allclose(sub, method.models.loaded(method.full_spec(), whole).eval()(x)[-1], atol=1e-3)


def test_over_k_rounds_every_channel_of_a_k_wide_layer_is_held_r_k_times_by_a_width_r_client():
    """FedRolex's claim that the roll trains every channel equally: K = 16 by hand, then the widest layer of a real
    model (32 channels) under the five capacities 1/16 .. 1 of its regime, through ``plan`` and the sub-model shapes."""
    for r in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1):
        held = torch.zeros(16)
        for t in range(1, 17):
            held[window((16,), (int(16 * r),), window_offset(t))] += 1
        assert held.tolist() == [16 * r] * 16
    widths = [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
    method, g = make(levels=5, widths=widths)
    name = "blocks.3.0.weight"  # the widest layer: 32 output channels
    k = g[name].shape[0]
    assert k == 32
    for level, r in enumerate(widths, start=1):
        held = torch.zeros(k)
        for t in range(1, k + 1):
            spec = method.plan(0, Budget(level=level), t)
            s = method.models.shapes(spec)[name][0]
            held[window((k,), (s,), spec.offset)] += 1
        assert held.tolist() == [r * k] * k, level


def test_the_regime_preset_rolls_every_levels_window_over_every_channel_of_the_widest_layer():
    """fedrolex-regime: capacities 1/16 .. 1 redrawn every round, and at least as many rounds as the widest layer has
    channels, so that each level's window starts at every index of it (each channel held r K times by the window)."""
    from hetfl.bench.runner import load_preset, preset_configs
    from hetfl.methods import build_method

    _, preset = load_preset("fedrolex-regime")
    for label, _, cfg in preset_configs(preset, {}, [0]):
        assert cfg.scenario == "dynamic" and cfg.level_widths == [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0], label
        method = build_method(cfg, (1, 28, 28), 10)
        widest = max(t.shape[0] for n, t in method.init_state(0).params.items() if t.dim() > 1 and "exits" not in n)
        assert cfg.rounds >= widest, (label, cfg.rounds, widest)
