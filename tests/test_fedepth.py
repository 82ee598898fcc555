"""FeDepth and m-FeDepth: the decomposition, the block-wise trainer, the skip connection, mutual
learning, and the memory budget measured on real steps."""

import pytest
import torch
import torch.nn.functional as F

from hetfl.trainers.blockwise import feature_shapes, group_parameters, skip_connection, train_blockwise, trained_prefixes
from hetfl.costs import group_memory, random_batch, width_memory
from hetfl.errors import HetflError
from hetfl.losses import deep_mutual_learning
from hetfl.methods import build_method, config_from
from hetfl.methods.fedepth import decompose
from hetfl.models import model_family
from hetfl.task import Blockwise, Task
from hetfl.task import TrainOptions
from hetfl.trainers.schedule import ClientData

FAMILY = model_family("preresnet20", (1, 8, 8), 10, width=0.25, exit_after=(8,))
AUX = model_family("preresnet20", (1, 8, 8), 10, width=0.25, exit_after=tuple(range(9)))
OPTS = TrainOptions(epochs=1, batch_size=8, momentum=0.9, weight_decay=5e-4)


def additive(costs):
    """cost(first, last) = the sum of the blocks' costs (the paper's Fig. 3 example)."""
    return lambda first, last: sum(costs[first:last + 1])


def test_decomposition_of_the_papers_figure_3():
    cost = additive([3, 2, 1, 0.5, 0.5, 0.5])
    assert decompose(6, cost, 3) == ((0, 0), (1, 2), (3, 5))  # client k: J_k = 3
    assert decompose(6, cost, 5) == ((0, 1), (2, 5))  # client k': the first two blocks, then the other four


def test_partial_training_leaves_out_exactly_the_blocks_that_do_not_fit_alone():
    cost = additive([3, 2, 1, 0.5, 0.5, 0.5])
    assert decompose(6, cost, 1.5) == ((2, 3), (4, 5))  # blocks 0 and 1 cost more than 1.5 on their own
    assert decompose(6, cost, 2.5) == ((1, 1), (2, 5))
    assert decompose(6, cost, 0.4) == ()


def data(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g), torch.arange(n))


def trained(plan, family=FAMILY, d=None, models=1, opts=OPTS):
    """(start state, models after training ``plan``, peak bytes) from seeded models."""
    nets = [family.build(seed=m) for m in range(models)]
    start = {k: v.clone() for k, v in nets[0].state_dict().items()}
    _, peak = train_blockwise(nets, plan, d or data(), opts, 0.1, torch.Generator().manual_seed(1))
    return start, nets, peak


def blocks_of(state, blocks):
    return {k: v for k, v in state.items() if k.startswith(tuple(f"blocks.{b}." for b in blocks))}


def test_frozen_blocks_stay_bit_identical_under_momentum_and_weight_decay():
    first_only = Blockwise(groups=((0, 2),))
    both = Blockwise(groups=((0, 2), (3, 8)))
    start, (after_first,), _ = trained(first_only)
    _, (after_both,), _ = trained(both)
    one, two = after_first.state_dict(), after_both.state_dict()
    for k, v in blocks_of(start, range(3, 9)).items():  # later blocks: not run while group 1 trains
        assert torch.equal(one[k], v), k
    for k in [*blocks_of(one, range(3)), "stem.0.weight"]:  # group 2's steps leave group 1 exactly as it was
        assert torch.equal(two[k], one[k]), k
    assert not torch.equal(two["blocks.5.conv1.weight"], start["blocks.5.conv1.weight"])
    assert not torch.equal(two["exits.0.4.weight"], one["exits.0.4.weight"])  # the head trains with every group


def test_partial_training_trains_and_uploads_only_the_planned_blocks():
    plan = Blockwise(groups=((2, 3), (6, 8)))
    start, (net,), _ = trained(plan)
    after = net.state_dict()
    for k in [*blocks_of(start, (0, 1, 4, 5)), "stem.0.weight"]:
        assert torch.equal(after[k], start[k]), k
    for b in (2, 3, 6, 8):
        assert not torch.equal(after[f"blocks.{b}.conv1.weight"], start[f"blocks.{b}.conv1.weight"]), b
    assert trained_prefixes(net, plan) == ("blocks.2.", "blocks.3.", "exits.0.", "blocks.6.", "blocks.7.", "blocks.8.")


def test_skip_connection_subsamples_and_zero_pads_symmetrically():
    h = torch.randn(2, 16, 28, 28)
    out = skip_connection(h, (64, 7, 7))
    assert out.shape == (2, 64, 7, 7)
    assert torch.equal(out[:, 24:40], h[:, :, ::4, ::4])  # 48 zero channels: 24 before, 24 after
    assert not out[:, :24].any() and not out[:, 40:].any()
    mid = skip_connection(torch.randn(2, 32, 14, 14), (64, 7, 7))
    assert mid.shape == (2, 64, 7, 7) and not mid[:, :16].any() and not mid[:, 48:].any()
    odd = torch.randn(1, 16, 7, 7)  # 7 -> 4 -> 2 through two stride-2 stages: every 4th of 7 positions
    assert torch.equal(skip_connection(odd, (64, 2, 2))[:, 24:40], odd[:, :, ::4, ::4])
    same = torch.randn(2, 64, 7, 7)
    assert skip_connection(same, (64, 7, 7)) is same
    with pytest.raises(ValueError, match="no parameter-free skip"):
        skip_connection(torch.randn(2, 64, 7, 7), (32, 7, 7))


def test_head_and_auxiliary_classifiers_a_group_trains():
    net = FAMILY.build()
    names = {id(p): n for n, p in net.named_parameters()}
    head = {names[id(p)] for p in group_parameters(net, (3, 4), aux=False)}
    assert head == {n for n in names.values() if n.startswith(("blocks.3.", "blocks.4.", "exits.0."))}
    aux = AUX.build()
    names = {id(p): n for n, p in aux.named_parameters()}
    own = {names[id(p)] for p in group_parameters(aux, (0, 1), aux=True)}
    assert own == {n for n in names.values() if n.startswith(("stem.", "blocks.0.", "blocks.1.", "exits.1."))}
    _, (net,), _ = trained(Blockwise(groups=((0, 1), (2, 8)), head="aux"), family=AUX)
    assert trained_prefixes(net, Blockwise(groups=((0, 1), (2, 8)), head="aux")) == (
        "stem.", "blocks.0.", "blocks.1.", "exits.1.", "blocks.2.", "blocks.3.", "blocks.4.", "blocks.5.", "blocks.6.",
        "blocks.7.", "blocks.8.", "exits.8.")


def test_deep_mutual_learning_by_hand():
    z1, z2 = torch.tensor([[1.0, 0.0, -1.0]], requires_grad=True), torch.tensor([[0.0, 2.0, 0.0]], requires_grad=True)
    y = torch.tensor([0])
    p1, p2 = z1.detach().softmax(1), z2.detach().softmax(1)
    ce1, ce2 = -p1[0, 0].log(), -p2[0, 0].log()
    kl21 = (p2 * (p2.log() - p1.log())).sum()  # KL(p2 || p1): model 1 learns from model 2
    kl12 = (p1 * (p1.log() - p2.log())).sum()
    loss = deep_mutual_learning([z1, z2], y)
    assert loss.item() == pytest.approx((ce1 + kl21 + ce2 + kl12).item(), rel=1e-6)
    loss.backward()
    # teachers detached: model 1's gradient is that of CE_1 + KL(p2 || p1) in z1 alone, = p1 - onehot + p1 - p2
    onehot = F.one_hot(y, 3).float()
    assert torch.allclose(z1.grad, (p1 - onehot) + (p1 - p2), atol=1e-6)
    assert deep_mutual_learning([z1], y).item() == pytest.approx(ce1.item(), rel=1e-6)


def test_mutual_learning_trains_every_model_and_keeps_them_apart():
    plan = Blockwise(groups=((0, 8),), models=2)
    start, nets, peak = trained(plan, models=2)
    alone = trained(Blockwise(groups=((0, 8),)))[2]
    assert peak > 1.9 * alone  # two models' activations at once
    assert not torch.equal(nets[0].state_dict()["stem.0.weight"], start["stem.0.weight"])
    assert not torch.equal(nets[0].state_dict()["stem.0.weight"], nets[1].state_dict()["stem.0.weight"])


def test_a_full_batch_step_measures_what_the_server_planned():
    """The client's per-step measure and the cost model's are one rule: on a batch of the planned size they agree."""
    for group, models in (((0, 1), 1), ((3, 8), 1), ((2, 4), 2)):
        planned = group_memory(FAMILY, *group, batch_size=8, models=models)
        _, _, peak = trained(Blockwise(groups=(group,), models=models), d=data(n=8), models=models)
        assert peak == planned, group
    whole = group_memory(FAMILY, 0, 8, batch_size=8)
    assert whole == width_memory(FAMILY, 1.0, 8)  # one group of every block is plain training of the model


def test_buffered_prefix_is_counted_in_the_steps_memory():
    plan = Blockwise(groups=((3, 8),), budget_bytes=10**9, group_bytes=(0,))
    _, _, plain = trained(plan, d=data(n=8))
    _, _, buffered = trained(Blockwise(groups=((3, 8),), budget_bytes=10**9, group_bytes=(0,), buffer=True),
                             d=data(n=8))
    per_sample = torch.Size(feature_shapes(FAMILY.build(), random_batch(FAMILY, 2)[0])[3]).numel() * 4
    assert buffered == plain + 8 * per_sample
    _, _, refused = trained(Blockwise(groups=((3, 8),), budget_bytes=1, group_bytes=(0,), buffer=True), d=data(n=8))
    assert refused == plain  # a buffer beyond the budget is not kept


@pytest.mark.parametrize("method", ["fedepth", "m-fedepth"])
def test_fedepth_run_keeps_every_step_within_every_clients_budget(tiny_cfg, method):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method=method, model="preresnet20", rounds=2, batch_size=8))
    models = [sim.method.schedule(b).models for b in sim.method.level_budgets]
    assert max(models) == (2 if method == "m-fedepth" else 1)  # Fair budgets: the rich clients train two
    summary = sim.run(progress=False)
    records = [c for r in sim.history for c in r["memory"].values()]
    assert len(records) == sum(r["clients"] for r in sim.history) > 0
    assert all(0.5 < c["ratio"] <= 1 and c["used_bytes"] <= c["budget_bytes"] for c in records)
    assert summary["within_budget"] == 1.0 and summary["max_memory_ratio"] == max(c["ratio"] for c in records)
    assert summary["accuracy"] > 0.2


def test_budgets_of_width_ratios_are_the_measured_memory_of_those_widths():
    cfg = config_from({"method": "heterofl", "model": "preresnet20", "budget": "width-memory",
                       "budget_ratios": [1 / 6, 1 / 3, 1 / 2, 2.0], "widths": [1 / 6, 1 / 3, 1 / 2, 1.0]})
    method = build_method(cfg, (1, 8, 8), 10)
    plain = model_family("preresnet20", (1, 8, 8), 10, exit_after=(8,))
    widths = (1 / 6, 1 / 3, 1 / 2, 2)
    assert [b.memory_bytes for b in method.level_budgets] == [width_memory(plain, r, 32) for r in widths]
    assert [method.level_spec(l).width for l in (1, 2, 3, 4)] == [1 / 6, 1 / 3, 1 / 2, 1.0]  # the budget's own width


def test_m_fedepth_gives_two_models_where_two_whole_models_fit():
    cfg = config_from({"method": "m-fedepth", "model": "preresnet20", "model_width": 0.25,
                       "budget_ratios": [1 / 6, 1 / 3, 1 / 2, 2.0]})
    method = build_method(cfg, (1, 8, 8), 10)
    plans = [method.schedule(b) for b in method.level_budgets]
    assert plans[-1].groups == ((0, 8),) and plans[-1].models == 2
    assert method.stateful_clients
    for plan in plans:
        assert all(b <= plan.budget_bytes for b in plan.group_bytes)
        if plan.models == 1:  # two models in its own groups would not fit
            assert any(method.group_cost(f, l, 2) > plan.budget_bytes for f, l in plan.groups)


@pytest.mark.parametrize("plan", ["models", "depth"])
def test_m_fedepth_under_fair_budgets_trades_group_size_for_models_by_default(plan):
    """The paper's Table 2 has m-FeDepth differ from FeDepth under Fair budgets: its rich clients train two
    models in finer groups (``models``); ``depth`` keeps FeDepth's groups, so Fair m-FeDepth is FeDepth."""
    fair = {"model": "preresnet20", "model_width": 0.5, "budget_ratios": [1 / 6, 1 / 3, 1 / 2, 1.0]}
    single = build_method(config_from({"method": "fedepth", **fair}), (1, 28, 28), 10)
    mutual = build_method(config_from({"method": "m-fedepth", "mutual_plan": plan, **fair}), (1, 28, 28), 10)
    for budget in mutual.level_budgets:
        one, both = single.schedule(budget), mutual.schedule(budget)
        covered = lambda groups: {b for f, l in groups for b in range(f, l + 1)}  # noqa: E731
        assert covered(both.groups) == covered(one.groups)  # no block is given up for a second model
        assert all(mutual.group_cost(f, l, both.models) <= budget.memory_bytes for f, l in both.groups)
        if both.models == 1:
            assert both.groups == one.groups
        else:
            assert len(both.groups) > len(one.groups)  # finer groups: two models of a longer one do not fit
    models = [mutual.schedule(b).models for b in mutual.level_budgets]
    assert models == ([1, 1, 2, 2] if plan == "models" else [1, 1, 1, 1])


def test_task_carries_the_plan_through_json(tiny_cfg):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="m-fedepth", model="preresnet20", budget_ratios=[1 / 6, 1 / 3, 1 / 2, 2.0]))
    task, local = sim.method.configure(sim.state, 0, sim.scenario.budget(0, 1), 1)
    assert task.trainer == "blockwise" and set(local) == set(sim.state.params)
    assert Task.from_json(task.to_json()) == task


@pytest.mark.parametrize("changes,fragment", [
    ({"budget": "level"}, "use --budget width-memory"),
    ({"server_opt": "feddyn"}, "not feddyn"),
    ({"exits": [2, 8]}, "drop --exits"),
    ({"buffer_prefix": True, "flip": True}, "buffer_prefix keeps"),
    ({"budget_ratios": [0.001, 0.002]}, "no budget trains a block of preresnet20"),
])
def test_bad_fedepth_configs_are_one_line_errors(changes, fragment):
    with pytest.raises(HetflError, match=fragment):
        build_method(config_from({"method": "fedepth", "model": "preresnet20", **changes}), (1, 8, 8), 10)


def test_clients_whose_budget_trains_no_block_sit_out_with_a_warning(capsys):
    method = build_method(config_from({"method": "fedepth", "budget_ratios": [0.001, 0.5, 0.75, 1.0]}), (1, 8, 8), 10)
    assert "trains no block of preresnet20" in capsys.readouterr().err
    assert method.plan(0, method.level_budgets[0], 1) is None
    assert method.configure(method.init_state(0), 0, method.level_budgets[0], 1) is None
    assert all(method.plan(0, b, 1) is not None for b in method.level_budgets[1:])
    assert "sits out" in str(method.budget_report())


def test_no_batch_exceeds_the_batch_size_where_the_budget_is_measured():
    from hetfl.trainers.schedule import batches

    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    merged = batches(17, 8, g())
    assert [len(b) for b in merged] == [8, 9]  # the default: a last sample joins the batch before
    within = batches(17, 8, g(), within=True)
    assert [len(b) for b in within] == [8, 5, 4] and torch.equal(torch.cat(within), torch.cat(merged))


def test_options_added_later_are_recorded_only_when_set():
    """Bench folders are named by a hash of the recorded config: an earlier run's must not change."""
    assert "exits" not in config_from({"method": "alllarge"}).to_dict()
    assert config_from({"method": "alllarge", "exits": [1, 3]}).to_dict()["exits"] == [1, 3]
    assert "sit_out" not in config_from({"method": "depthfl"}).to_dict()
    assert config_from({"method": "depthfl", "sit_out": True}).to_dict()["sit_out"] is True


def test_depthfl_clients_that_afford_no_depth_sit_out_when_asked():
    values = {"method": "depthfl", "model": "preresnet20", "exits": list(range(9)), "budget": "width-memory",
              "budget_ratios": [1 / 6, 1 / 3, 1 / 2, 1.0]}
    with pytest.raises(HetflError, match="smaller than the smallest sub-model"):
        build_method(config_from(values), (1, 28, 28), 10)
    method = build_method(config_from({**values, "sit_out": True}), (1, 28, 28), 10)
    assert method.plan(0, method.level_budgets[0], 1) is None
    assert [method.level_spec(l).depth for l in (2, 3, 4)] == sorted(method.level_spec(l).depth for l in (2, 3, 4))


def test_costs_command_prints_the_decomposition_per_budget(capsys):
    from hetfl.cli import main

    assert main(["costs", "preresnet20", "--method", "fedepth", "--dataset", "digits", "--model-width", "0.25",
                 "--batch-size", "8", "--no-latency"]) == 0
    out = capsys.readouterr().out
    assert "decomposition per budget" in out and "B1" in out and "largest step / budget" in out


def test_the_bench_table_shows_the_measured_memory_when_runs_have_it():
    from hetfl.report import bench_table

    def run(ratio):
        return {"accuracy": 0.8, "headline": "last", "best_round": 3, "local_accuracy": None, "final": {"global": {
            "exit1": 0.8, "ensemble": 0.8}}, "max_memory_ratio": ratio, "within_budget": None if ratio is None else 1.0,
            "bytes_down_per_round": 1e6, "wall_seconds": 1.0}

    table = bench_table({"FeDepth": [run(0.97), run(0.99)], "HeteroFL": [run(None), run(None)]})
    assert "max memory/budget" in table and "0.980 ± 0.014" in table and "100.00 ± 0.00" in table
    assert "max memory/budget" not in bench_table({"HeteroFL": [run(None)]})
