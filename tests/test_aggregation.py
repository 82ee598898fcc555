"""Masked aggregation and server optimizers, each checked against a hand computation."""

import pytest
import torch

from hetfl.aggregation import FedAdamServer, FedAvgServer, FedDynServer, MaskedMean, ServerState
from hetfl.slicing import extract, scatter

t = torch.tensor


def two_clients(global_state):
    """Client A holds the first two elements (weight 1), client B the first one (weight 3)."""
    agg = MaskedMean(global_state)
    agg.add({"w": t([1.0, 2.0])}, weight=1.0)
    agg.add({"w": t([4.0])}, weight=3.0)
    return agg


def test_masked_mean_by_hand_unheld_element_keeps_its_value():
    g = {"w": t([10.0, 10.0, 10.0])}
    agg = two_clients(g)
    mean, mask = agg.mean()["w"]
    assert mask.tolist() == [True, True, False]
    assert torch.allclose(mean[:2], t([(1 * 1 + 4 * 3) / 4, 2.0]))
    new = FedAvgServer(lr=1.0).step(ServerState(g), agg).params
    assert new["w"].tolist() == [3.25, 2.0, 10.0]


def test_fedavg_server_learning_rate():
    g = {"w": t([10.0, 10.0, 10.0])}
    new = FedAvgServer(lr=0.5).step(ServerState(g), two_clients(g)).params
    assert torch.allclose(new["w"], t([10 + 0.5 * (3.25 - 10), 10 + 0.5 * (2 - 10), 10.0]))


def test_names_no_client_held_are_unchanged_and_2d_corners():
    g = {"a": torch.zeros(2, 3), "b": t([7.0])}
    agg = MaskedMean(g)
    agg.add({"a": torch.ones(1, 2)}, weight=2.0)
    agg.add({"a": 3 * torch.ones(2, 1)}, weight=2.0)
    new = FedAvgServer().step(ServerState(g), agg).params
    assert new["b"] is g["b"]
    assert new["a"].tolist() == [[2.0, 1.0, 0.0], [3.0, 0.0, 0.0]]


def test_fedadam_one_step_by_hand():
    g = {"w": t([1.0, 1.0, 1.0])}
    opt = FedAdamServer(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    agg = MaskedMean(g)
    agg.add({"w": t([3.0, 0.0])}, weight=1.0)  # pseudo-gradient D = [2, -1], third element unheld
    state = opt.step(ServerState(g), agg)
    new = state.params
    m = [0.1 * 2, 0.1 * -1]
    v = [0.01 * 4, 0.01 * 1]
    expected = [1 + 0.1 * m[0] / (v[0] ** 0.5 + 1e-3), 1 + 0.1 * m[1] / (v[1] ** 0.5 + 1e-3), 1.0]
    assert torch.allclose(new["w"], t(expected))
    assert torch.allclose(state.opt["m/w"], t(m + [0.0]))
    assert torch.allclose(state.opt["v/w"], t(v + [0.0]))
    # second round, only the first element held: the second keeps its moments
    agg = MaskedMean(new)
    agg.add({"w": new["w"][:1] + 1.0}, weight=1.0)
    again = opt.step(state, agg)
    assert torch.allclose(again.opt["m/w"], t([0.9 * 0.2 + 0.1 * 1.0, -0.1, 0.0]))
    assert torch.allclose(again.opt["v/w"], t([0.99 * 0.04 + 0.01 * 1.0, 0.01, 0.0]))
    assert torch.allclose(state.opt["m/w"], t(m + [0.0]))  # the step returns a new state; the old one is kept


def test_feddyn_server_by_hand():
    """N = 4 clients, alpha = 0.1; A holds [2, 3], B holds [4]: counts [2, 1, 0], means [3, 3, -]."""
    g = {"w": t([1.0, 1.0, 1.0])}
    server = FedDynServer(alpha=0.1, num_clients=4)
    agg = MaskedMean(g)
    agg.add({"w": t([2.0, 3.0])}, weight=1.0)
    agg.add({"w": t([4.0])}, weight=1.0)
    state = server.step(ServerState(g), agg)
    new = state.params
    h = [-0.1 * 2 / 4 * (3 - 1), -0.1 * 1 / 4 * (3 - 1), 0.0]
    assert torch.allclose(state.opt["h/w"], t(h))
    assert torch.allclose(new["w"], t([3 - h[0] / 0.1, 3 - h[1] / 0.1, 1.0]))  # [4, 3.5, 1]


def test_extract_and_scatter_are_inverse_on_the_corner():
    g = {"conv": torch.arange(24.0).reshape(4, 3, 2), "fc": torch.arange(6.0).reshape(2, 3)}
    local = extract(g, {"conv": torch.Size([2, 3, 2]), "fc": torch.Size([2, 2])})
    assert torch.equal(local["conv"], g["conv"][:2])
    assert torch.equal(local["fc"], t([[0.0, 1.0], [3.0, 4.0]]))
    value, mask = scatter(local, g)["fc"]
    assert mask.tolist() == [[True, True, False], [True, True, False]]
    assert value.tolist() == [[0.0, 1.0, 0.0], [3.0, 4.0, 0.0]]


def test_extract_and_aggregate_with_group_prefix_and_shared_names():
    from hetfl.slicing import SubModel

    g = {"level1/w": t([1.0, 2.0]), "level2/w": t([3.0, 4.0]), "stem.b": t([9.0])}
    spec = SubModel(depth=1, group="level2/", shared=("stem.",))
    local = extract(g, {"w": torch.Size([1]), "stem.b": torch.Size([1])}, spec)
    assert local["w"].tolist() == [3.0] and local["stem.b"].tolist() == [9.0]
    agg = MaskedMean(g)
    agg.add({"w": t([5.0]), "stem.b": t([1.0])}, 1.0, spec)
    assert set(agg.sums) == {"level2/w", "stem.b"}


@pytest.mark.parametrize("weight", [1.0, 5.0])
def test_single_client_mean_is_its_own_tensor(weight):
    g = {"w": torch.zeros(3)}
    agg = MaskedMean(g)
    agg.add({"w": t([0.3, 0.7, 1.1])}, weight=weight)
    assert torch.allclose(FedAvgServer().step(ServerState(g), agg).params["w"], t([0.3, 0.7, 1.1]))
