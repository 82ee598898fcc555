"""The client side: FedDyn's linear term and pull, FedProx, and a client whose depth changes."""

import torch
from torch import nn

from hetfl.config import Config
from hetfl.losses import exits_ce
from hetfl.methods.alllarge import AllLarge
from hetfl.models import ArchSpec, ModelFamily, MultiExitModel
from hetfl.slicing import SubModel, extract
from hetfl.client import client_update
from hetfl.trainers.schedule import ClientData


def linear_builder(input_shape, num_classes, *, width, depth, norm):
    """Blocks Linear(3, 3) and exits Linear(3, 2), no biases: small enough to follow by hand."""
    d = input_shape[0]
    blocks = [nn.Linear(d, d, bias=False) for _ in range(depth)]
    exits = [nn.Linear(d, num_classes, bias=False) for _ in range(depth)]
    return MultiExitModel(nn.Identity(), blocks, exits, tuple(range(depth)))


def make_method(**cfg):
    family = ModelFamily("linear", (3, 1, 1), 2, ArchSpec(2, (0, 1)), linear_builder)
    base = dict(momentum=0.0, weight_decay=0.0, batch_size=100, lr=0.1, num_clients=4, levels=2)
    method = AllLarge(Config(**{**base, **cfg}), family, num_levels=2)
    return method, method.init_state(seed=0).params


def train(method, local, spec, d, state=None, round_index=1, client=0):
    """One client update of ``spec`` from ``local``, through the task the method emits."""
    task = method.task(method.init_state(0), spec, client, round_index)
    return client_update(local, task, d, state, models=method.models)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=g)
    return ClientData(x, torch.tensor([0, 1, 0, 1, 1, 0]), torch.arange(6))


def grad_at(method, spec, state, d):
    """The plain CE gradient at ``state`` (one full batch)."""
    model = method.family.build(depth=spec.depth)
    model.load_state_dict(state)
    exits_ce(model(d.x), d.y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_feddyn_client_step_by_hand_with_depth_changes():
    alpha, lr = 0.5, 0.1
    method, g = make_method(server_opt="feddyn", feddyn_alpha=alpha, lr=lr)
    d = data()

    # round 1: depth 1, no state yet -> w1 = w0 - lr grad, g_k = -alpha (w1 - w0) on depth-1 names only
    shallow = SubModel(depth=1)
    w0 = extract(g, method.models.shapes(shallow))
    grad = grad_at(method, shallow, w0, d)
    update, state = train(method, w0, shallow, d, None)
    for n in w0:
        assert torch.allclose(update.state[n], w0[n] - lr * grad[n], atol=1e-6)
        assert torch.allclose(state[n], -alpha * (update.state[n] - w0[n]), atol=1e-7)
    assert set(state) == set(w0) and state["blocks.0.weight"].shape == g["blocks.0.weight"].shape

    # round 2: the client can now afford depth 2; depth-2 names start from zero state
    deep = SubModel(depth=2)
    w0b = extract(g, method.models.shapes(deep))
    grad = grad_at(method, deep, w0b, d)
    update, state2 = train(method, w0b, deep, d, state)
    for n in w0b:
        gk = state.get(n, torch.zeros_like(w0b[n]))
        expected = w0b[n] - lr * (grad[n] - gk)  # the pull alpha (w - w_global) is 0 at the first step
        assert torch.allclose(update.state[n], expected, atol=1e-6)
        assert torch.allclose(state2[n], gk - alpha * (update.state[n] - w0b[n]), atol=1e-6)

    # round 3: back to depth 1: the depth-2-only state is carried over untouched
    _, state3 = train(method, w0, shallow, d, state2)
    for n in set(state2) - set(w0):
        assert torch.equal(state3[n], state2[n])


def test_feddyn_pull_acts_from_the_second_step():
    """Two steps: the second gradient includes alpha (w1 - w0) - g_k."""
    alpha, lr = 0.5, 0.1
    method, g = make_method(server_opt="feddyn", feddyn_alpha=alpha, lr=lr, batch_size=3)
    d = data()
    spec = SubModel(depth=1)
    w0 = extract(g, method.models.shapes(spec))
    gk = {n: torch.full_like(t, 0.2) for n, t in w0.items()}
    update, _ = train(method, w0, spec, d, dict(gk))
    replayed = replay_sgd(method, spec, w0, d, lr, lambda n, p: -gk[n] + alpha * (p - w0[n]))
    for n, p in replayed.named_parameters():
        assert torch.allclose(update.state[n], p, atol=1e-6)


def replay_sgd(method, spec, w0, d, lr, pull):
    """Plain SGD by hand over the client's batch order (batches of 3), gradient + pull(name, param)."""
    from hetfl.seeding import torch_generator
    from hetfl.trainers.schedule import batches

    model = method.family.build(depth=spec.depth)
    model.load_state_dict(w0)
    for b in batches(len(d), 3, torch_generator(0, "train", 1, 0)):
        model.zero_grad()
        exits_ce(model(d.x[b]), d.y[b]).backward()
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= lr * (p.grad + pull(n, p))
    return model


def test_fedprox_pull_by_hand():
    mu, lr = 0.3, 0.1
    method, g = make_method(prox_mu=mu, lr=lr, batch_size=3)
    d = data()
    spec = SubModel(depth=2)
    w0 = extract(g, method.models.shapes(spec))
    update, state = train(method, w0, spec, d, None)
    assert state is None
    replayed = replay_sgd(method, spec, w0, d, lr, lambda n, p: mu * (p - w0[n]))
    for n, p in replayed.named_parameters():
        assert torch.allclose(update.state[n], p, atol=1e-6)


def test_train_exits_last_holds_and_trains_only_the_last_exit():
    method, g = make_method(train_exits="last")
    spec = method.full_spec()
    assert spec.exits == (2,)
    w0 = extract(g, method.models.shapes(spec))
    assert "exits.0.weight" not in w0  # not sent, not trained, not uploaded
    update, _ = train(method, w0, spec, data(), None)
    assert set(update.state) == set(w0)
    assert not torch.equal(update.state["exits.1.weight"], w0["exits.1.weight"])
    assert method.models.module(spec)(data().x)[0].shape == (6, 2)  # one logit tensor: the last exit


def test_gradient_clipping_by_norm_and_by_value_by_hand():
    """One SGD step at lr 1 from w = 0 on loss = 10 * sum(w * x): the gradient is 10 * x, clipped as configured."""
    from hetfl.task import TrainOptions
    from hetfl.trainers.step import sgd_update

    x = torch.tensor([3.0, -0.5, 0.0, 4.0])

    def step(**clip):
        w = torch.zeros(4, requires_grad=True)
        grad, = torch.autograd.grad(10 * (w * x).sum(), w)
        (new,), _ = sgd_update([w.detach()], [grad], None, TrainOptions(momentum=0.0, weight_decay=0.0, **clip), 1.0)
        return -new  # the applied gradient

    g = torch.tensor([30.0, -5.0, 0.0, 40.0])
    assert torch.equal(step(), g)
    torch.testing.assert_close(step(clip_grad=5.0), g * 5 / g.norm())  # the L2 norm, 50.2, down to 5
    assert torch.equal(step(clip_value=1.0), torch.tensor([1.0, -1.0, 0.0, 1.0]))  # ReeFL App. A: each value in [-1, 1]
