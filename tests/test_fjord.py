"""FjORD: the widths a client samples, their seeded per-step draws, the sampled width's step (and its
self-distillation) worked by hand, and short real runs on digits."""

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from hetfl import augment
from hetfl.devices import Budget
from hetfl.errors import HetflError
from hetfl.executors.batched import BatchedExecutor
from hetfl.methods import config_from
from hetfl.methods.fjord import FjORD
from hetfl.models import model_family
from hetfl.models.cache import build_model
from hetfl.recipes import ExitsCE, OrderedDropout, step_variants
from hetfl.slicing import corner, extract
from hetfl.task import Task, TrainOptions
from hetfl.trainers.objectives import objective_for
from hetfl.trainers.schedule import Step
from hetfl.trainers.sgd import SGDTrainer, client_step


def make(**cfg):
    """FjORD on a tiny CNN (8x8 inputs, channels 4/8/16/32) with 4 levels: widths 1/4, 1/2, 3/4, 1."""
    family = model_family("cnn", (1, 8, 8), 10, width=1 / 16)
    method = FjORD(config_from({"method": "fjord", **cfg}), family, num_levels=cfg.get("levels", 4))
    return method, method.init_state(seed=0).params


def standalone(method, width, global_params):
    """A fresh model of ``width`` holding the leading slices of the global tensors (no cache, no slicing in it)."""
    spec = method.width_spec(width)
    model = build_model(method.family, spec)
    model.load_state_dict(extract(global_params, method.models.shapes(spec)), strict=False)
    return model.train()


def batch(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_a_client_samples_the_widths_up_to_its_own():
    method, _ = make()
    assert [method.plan(0, Budget(level=l), 1).width for l in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert method.widths_up_to(method.width_spec(0.5)) == [0.25, 0.5]
    recipe = method.recipe(method.width_spec(0.75), 1)
    assert [s.width for s in recipe.smaller] == [0.25, 0.5] and step_variants(recipe) == 3
    assert step_variants(method.recipe(method.width_spec(0.25), 1)) == 1  # the smallest tier has one width
    paper, _ = make(levels=5, widths=[0.2, 0.4, 0.6, 0.8, 1.0])
    assert paper.widths_up_to(paper.width_spec(0.6)) == [0.2, 0.4, 0.6]
    assert list(method.eval_specs()) == ["global", "width0.25", "width0.5", "width0.75"]


def test_the_task_carries_the_recipe_through_json():
    method, g = make(fjord_kd=True, fjord_kd_alpha=0.5, fjord_kd_tau=2.0)
    task, _ = method.configure(method.init_state(0), 3, Budget(level=3), 2)
    assert task.loss == OrderedDropout(smaller=(method.width_spec(0.25), method.width_spec(0.5)), kd=True,
                                       alpha=0.5, tau=2.0)
    assert Task.from_json(task.to_json()) == task


def test_distillation_weights_need_distillation():
    with pytest.raises(HetflError, match="add --fjord-kd true"):
        config_from({"method": "fjord", "fjord_kd_alpha": 0.5})
    with pytest.raises(HetflError, match="fjord_kd_tau"):
        config_from({"method": "fjord", "fjord_kd": True, "fjord_kd_tau": 0.0})


def schedule_of(task, num_samples=64, epochs=1):
    return SGDTrainer().schedule(replace(task, train=replace(task.train, epochs=epochs)), num_samples)


def test_the_sampled_widths_are_seeded_per_client_and_round_and_uniform():
    method, _ = make()
    state = method.init_state(0)
    task, _ = method.configure(state, 5, Budget(level=4), 3)
    widths = [s.variant for s in schedule_of(task, epochs=600)]  # 2 batches of 32 an epoch: 1200 draws of 4 widths
    assert len(widths) == 1200
    assert widths == [s.variant for s in schedule_of(task, epochs=600)]  # the same (seed, round, client): the same
    counts = Counter(widths)
    assert set(counts) == {0, 1, 2, 3} and all(240 <= c <= 360 for c in counts.values()), counts  # 300 +- 3.5 sd
    for other in (method.configure(state, 6, Budget(level=4), 3)[0], method.configure(state, 5, Budget(level=4), 4)[0],
                  replace(task, seed=1)):
        assert [s.variant for s in schedule_of(other, epochs=600)] != widths
    # drawn after the batches: the batches are those the same client gets with a plain CE recipe (HeteroFL)
    plain = schedule_of(replace(task, loss=ExitsCE()), epochs=2)
    assert all(torch.equal(a.batch, b.batch) and a.variant == 0 for a, b in zip(plain, schedule_of(task, epochs=2)))


def test_the_sampled_widths_loss_is_the_leading_slice_models_ce():
    method, g = make()
    spec = method.width_spec(1.0)  # p_max = 1: the client holds the global tensors
    model = method.models.loaded(spec, extract(g, method.models.shapes(spec)))
    params = dict(model.named_parameters())
    x, y = batch()
    recipe = method.recipe(spec, 1)
    for variant, width in enumerate((0.25, 0.5, 0.75, 1.0)):
        loss, _ = objective_for(recipe, method.models, variant)(model, params, x, y, None)
        expected = F.cross_entropy(standalone(method, width, g)(x)[-1], y)
        assert torch.allclose(loss, expected, atol=1e-6), width
    loss.backward()  # the own width: every tensor gets a gradient
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in params.items() if "weight" in n)


def test_self_distillation_by_hand():
    """CE(z_pmax) + (1 - alpha) CE(z_p) + alpha tau^2 mean_i sum_c q_c log(q_c / s_c), q = softmax(z_pmax / tau) and
    s = softmax(z_p / tau); a draw of p_max itself: CE + (1 - alpha) CE."""
    alpha, tau = 0.3, 2.0
    method, g = make(fjord_kd=True, fjord_kd_alpha=alpha, fjord_kd_tau=tau)
    spec = method.width_spec(0.75)
    model = method.models.loaded(spec, extract(g, method.models.shapes(spec)))
    params = dict(model.named_parameters())
    x, y = batch()
    recipe = method.recipe(spec, 1)
    z_max, z_p = standalone(method, 0.75, g)(x)[-1], standalone(method, 0.5, g)(x)[-1]
    q, s = torch.softmax(z_max / tau, 1), torch.softmax(z_p / tau, 1)
    kl = (q * (q.log() - s.log())).sum(1).mean()
    expected = F.cross_entropy(z_max, y) + (1 - alpha) * F.cross_entropy(z_p, y) + alpha * tau**2 * kl
    loss, _ = objective_for(recipe, method.models, 1)(model, params, x, y, None)
    assert torch.allclose(loss, expected, atol=1e-6)
    own, _ = objective_for(recipe, method.models, 2)(model, params, x, y, None)
    assert torch.allclose(own, (2 - alpha) * F.cross_entropy(z_max, y), atol=1e-6)
    # the teacher is detached: the KL alone moves only the student's slices (none beyond the half width)
    kd_only = objective_for(replace(recipe, alpha=1.0), method.models, 1)(model, params, x, y, None)[0]
    kd_only = kd_only - F.cross_entropy(model(x)[-1], y)
    grad = torch.autograd.grad(kd_only, params["blocks.1.0.weight"])[0]
    inside = corner(method.models.shapes(method.width_spec(0.5))["blocks.1.0.weight"])
    assert grad[inside].abs().sum() > 0
    outside = torch.ones_like(grad, dtype=torch.bool)
    outside[inside] = False
    assert grad[outside].abs().max() < 1e-6


def test_a_step_moves_only_the_sampled_widths_leading_slices():
    """Without momentum and weight decay, a step on width 1/4 moves the leading 1/4 slices as a plain SGD step of the
    width-1/4 model alone would, and leaves every other element of the client's tensors as it was."""
    method, g = make()
    spec = method.width_spec(1.0)
    module = method.models.loaded(spec, extract(g, method.models.shapes(spec)))
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    opts, lr = TrainOptions(momentum=0.0, weight_decay=0.0), 0.1
    x, y = batch()
    step = client_step(module, objective_for(method.recipe(spec, 1), method.models, 0), opts, lr)
    new, _, _, loss = step(params, None, None, x, y, None, None)
    small = standalone(method, 0.25, g)
    small_params = dict(small.named_parameters())
    small_loss = F.cross_entropy(functional_call(small, small_params, (x,))[-1], y)
    grads = dict(zip(small_params, torch.autograd.grad(small_loss, list(small_params.values()))))
    assert torch.allclose(loss, small_loss.detach(), atol=1e-6)
    moved = 0
    for name, before in params.items():
        inside = corner(small_params[name].shape)
        assert torch.allclose(new[name][inside], before[inside] - lr * grads[name], atol=1e-6), name
        outside = torch.ones_like(before, dtype=torch.bool)
        outside[inside] = False
        assert torch.equal(new[name][outside], before[outside]), name
        moved += bool(outside.any())
    assert moved > 0  # there were elements beyond the 1/4 width, and they kept their values


def test_fjord_learns_digits(tiny_cfg):
    from hetfl.sim import Simulation

    summary = Simulation(tiny_cfg(method="fjord", rounds=6, client_fraction=0.5, model_width=0.5)).run(progress=False)
    assert set(summary["final"]) == {"global", "width0.25", "width0.5", "width0.75"}
    assert summary["accuracy"] > 0.5


def test_batched_executor_stacks_the_clients_that_drew_a_width_and_matches_sequential(tiny_cfg):
    """With self-distillation: the same draws in both executors, the same weights."""
    from hetfl.sim import Simulation

    sims = []
    for executor in ("sequential", "batched"):
        sim = Simulation(tiny_cfg(method="fjord", fjord_kd=True, name=f"fjord-{executor}", executor=executor,
                                  rounds=1, client_fraction=0.5, levels=2))
        sim.run(progress=False)
        sims.append(sim)
    sequential, batched = sims
    assert isinstance(batched.executor, BatchedExecutor) and max(batched.executor.group_sizes) > 1
    for name, value in sequential.global_state.items():
        assert (value - batched.global_state[name]).abs().max() <= 1e-4, name
    assert sequential.history[-1]["train_loss"] == pytest.approx(batched.history[-1]["train_loss"], abs=1e-4)


def test_a_step_stacks_only_the_clients_that_drew_the_same_width():
    """Two clients of one group: at step 0 they drew widths 0 and 1 (a bucket each), at step 1 both drew 1 (one)."""
    clients = SimpleNamespace(x=torch.zeros(8, 1), parts={0: torch.arange(4), 1: torch.arange(4, 8)})
    jobs = [SimpleNamespace(client=c, task=SimpleNamespace(train=TrainOptions())) for c in (0, 1)]
    none = augment.Draws()
    schedules = [[Step(torch.tensor([0, 1]), none, 0), Step(torch.tensor([2, 3]), none, 1)],
                 [Step(torch.tensor([1, 0]), none, 1), Step(torch.tensor([3, 2]), none, 1)]]
    buckets = BatchedExecutor(clients).buckets(jobs, schedules)
    assert [(b.step, b.variant, b.members.tolist(), b.indices.tolist()) for b in buckets] == [
        (0, 0, [0], [[0, 1]]), (0, 1, [1], [[5, 4]]), (1, 1, [0, 1], [[2, 3], [7, 6]])]


def test_nested_aggregation_across_tiers_is_sample_weighted_by_hand():
    """Tiers 1/4 (value 1, 10 samples), 1/2 (value 2, 30 samples), 1 (value 4, 60 samples): an element in the 1/4
    corner is (10 + 60 + 240) / 100 = 3.1, one in the 1/2 corner but not the 1/4 one (60 + 240) / 90 = 10/3, one held
    by the full width only 4; the classifier's class rows are never sliced, so its 1/4 columns are 3.1 in every row."""
    from hetfl.aggregation import ServerState
    from hetfl.updates import Update

    method, g = make()
    updates = []
    for client, (width, value, samples) in enumerate(((0.25, 1.0, 10), (0.5, 2.0, 30), (1.0, 4.0, 60))):
        spec = method.width_spec(width)
        local = {n: torch.full(s, value) for n, s in method.models.shapes(spec).items()}
        updates.append(Update(client, spec, local, samples))
    new = method.aggregate(ServerState(g), updates).params
    conv = new["blocks.1.0.weight"]  # 8 x 4 global: 2 x 1 at 1/4, 4 x 2 at 1/2
    for (o, i), want in {(0, 0): 3.1, (1, 0): 3.1, (3, 1): 10 / 3, (2, 0): 10 / 3, (5, 0): 4.0, (0, 3): 4.0}.items():
        assert torch.allclose(conv[o, i], torch.full((3, 3), want)), (o, i)
    head = new["exits.3.2.weight"]  # 10 classes x 32 global channels: 8 at 1/4, 16 at 1/2
    assert torch.allclose(head[:, :8], torch.full((10, 8), 3.1))
    assert torch.allclose(head[:, 8:16], torch.full((10, 8), 10 / 3))
    assert torch.allclose(head[:, 16:], torch.full((10, 16), 4.0))
    assert torch.allclose(new["exits.3.2.bias"], torch.full((10,), 3.1))


def test_a_narrow_step_with_momentum_and_weight_decay_moves_the_outer_units_as_the_authors_sgd_does():
    """A full-width step, then a width-1/4 step, momentum 0.9 and weight decay 5e-4. Outside the 1/4 corner the second
    step's gradient is 0, yet those units move: buf2 = 0.9 buf1 + wd p1, p2 = p1 - lr buf2 (the first step's buffer
    is its gradient plus wd p0). That is ``torch.optim.SGD`` over the whole model (the authors' ``train``, Flower's
    baselines/fjord), run here on the same two losses: every tensor agrees."""
    method, g = make()
    spec = method.width_spec(1.0)
    module = method.models.loaded(spec, extract(g, method.models.shapes(spec)))
    p0 = {n: p.detach().clone() for n, p in module.named_parameters()}
    opts, lr = TrainOptions(momentum=0.9, weight_decay=5e-4), 0.1
    recipe = method.recipe(spec, 1)
    steps = [client_step(module, objective_for(recipe, method.models, v), opts, lr) for v in range(4)]
    (x1, y1), (x2, y2) = batch(seed=1), batch(seed=2)
    p1, buf1, carry, _ = steps[3](p0, None, None, x1, y1, None, None)  # variant 3: the client's own (full) width
    p2, _, _, _ = steps[0](p1, buf1, carry, x2, y2, None, None)  # variant 0: width 1/4

    reference = {n: t.clone().requires_grad_() for n, t in p0.items()}
    sgd = torch.optim.SGD(list(reference.values()), lr=lr, momentum=0.9, weight_decay=5e-4)
    small = method.models.module(method.width_spec(0.25)).train()
    small_shapes = method.models.shapes(method.width_spec(0.25))
    for x, y, narrow in ((x1, y1, False), (x2, y2, True)):
        sgd.zero_grad()
        if narrow:
            logits = functional_call(small, {n: reference[n][corner(s)] for n, s in small_shapes.items()}, (x,))
        else:
            logits = functional_call(module, reference, (x,))
        F.cross_entropy(logits[-1], y).backward()
        sgd.step()
    moved = 0
    for name, before in p1.items():
        assert torch.allclose(p2[name], reference[name].detach(), atol=1e-6), name
        outside = torch.ones_like(before, dtype=torch.bool)
        outside[corner(small_shapes[name])] = False
        by_hand = before - lr * (0.9 * buf1[name] + 5e-4 * before)
        assert torch.allclose(p2[name][outside], by_hand[outside], atol=1e-7), name
        moved += int((p2[name][outside] != before[outside]).sum())
    assert moved > 0  # the units beyond the drawn width moved without a gradient of their own
