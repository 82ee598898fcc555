"""DepthFL: Eq. (1)'s self-distillation checked by hand, the KD ramp, per-depth counts, method defaults."""

import math

import pytest
import torch

from hetfl.aggregation import MaskedMean
from hetfl.methods import config_from
from hetfl.methods.options import MutualKD
from hetfl.losses import mutual_kd
from hetfl.models import model_family
from hetfl.slicing import SubModel, extract


def kl(p, q):
    return float((p * (p.log() - q.log())).sum())


def test_mutual_kd_value_by_hand_two_exits():
    z1, z2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    p1, p2 = z1.softmax(1), z2.softmax(1)
    # 1/(d-1) = 1: KL(p2 || p1) (exit 1 learns from exit 2) + KL(p1 || p2) (exit 2 learns from exit 1)
    assert mutual_kd([z1, z2]).item() == pytest.approx(kl(p2, p1) + kl(p1, p2), rel=1e-6)


def test_mutual_kd_gradient_direction_and_detach_three_exits():
    """d/dz_i of 1/(n-1) sum_{j != i} KL(p_j.detach() || p_i) is 1/(n-1) sum_{j != i} (p_i - p_j) / B."""
    torch.manual_seed(0)
    z = [torch.randn(2, 4, requires_grad=True) for _ in range(3)]
    mutual_kd(z).backward()
    p = [zi.detach().softmax(1) for zi in z]
    for i in range(3):
        expected = sum(p[i] - p[j] for j in range(3) if j != i) / 2 / 2  # 1/(n-1), batchmean over B = 2
        assert torch.allclose(z[i].grad, expected, atol=1e-6)


def test_mutual_kd_is_zero_for_one_exit_and_for_equal_exits():
    z = torch.randn(3, 5, requires_grad=True)
    assert mutual_kd([z]).item() == 0.0
    assert mutual_kd([z, z.clone(), z.clone()]).item() == pytest.approx(0.0, abs=1e-6)


def test_kd_ramp_follows_the_authors_consistency_rampup():
    kd = MutualKD(kd_weight=2.0, kd_ramp=0.3)  # over the first 300 of 1000 rounds, or 30 of 100
    assert kd.kd_weight_at(150, 1000) == kd.kd_weight_at(15, 100) == pytest.approx(2.0 * math.exp(-5 * 0.5 ** 2))
    assert kd.kd_weight_at(300, 1000) == kd.kd_weight_at(1000, 1000) == 2.0
    assert MutualKD(kd_weight=0.7).kd_weight_at(1, 10) == 0.7


def test_per_depth_averaging_counts():
    """Clients of depth 1, 2 and 4 (uniform weights): block 1 averaged over 3, block 2 over 2, blocks 3-4 over 1 / 0."""
    fam = model_family("cnn", (1, 28, 28), 10, width=0.125)
    g = fam.build(seed=0).state_dict()
    agg = MaskedMean(g)
    for depth in (1, 2, 4):
        local = extract(g, {n: t.shape for n, t in fam.build(depth=depth).state_dict().items()})
        agg.add(local, weight=1.0)
    counts = {n: int(w.max()) for n, w in agg.weights.items()}
    assert counts["blocks.0.0.weight"] == counts["exits.0.2.weight"] == 3
    assert counts["blocks.1.0.weight"] == counts["exits.1.2.weight"] == 2
    assert counts["blocks.3.0.weight"] == 1 and "blocks.2.0.weight" in counts
    assert all(int(w.min()) == int(w.max()) for w in agg.weights.values())  # depth slicing: whole tensors


def test_method_defaults_apply_only_when_not_given():
    c = config_from({"method": "depthfl"})
    assert (c.server_opt, c.method_options["kd_weight"]) == ("feddyn", 1.0)
    c = config_from({"method": "depthfl", "kd_weight": 0.0})
    assert (c.server_opt, c.method_options["kd_weight"]) == ("feddyn", 0.0)
    c = config_from({"method": "depthfl-fedavg"})
    assert (c.server_opt, c.method_options["kd_weight"]) == ("fedavg", 0.0)
    assert config_from({"method": "alllarge"}).method_options == {}  # no mutual KD to set


def test_negative_kd_weight_is_refused():
    from hetfl.errors import HetflError

    with pytest.raises(HetflError, match="kd_weight must be >= 0"):
        config_from({"method": "depthfl", "kd_weight": -0.1})


def test_depthfl_trains_digits_and_reports_the_ensemble(tiny_cfg):
    from hetfl.sim import Simulation

    cfg = tiny_cfg(method="depthfl", rounds=6, client_fraction=0.5, model_width=0.5)
    assert (cfg.server_opt, cfg.method_options["kd_weight"]) == ("feddyn", 1.0)
    summary = Simulation(cfg).run(progress=False)
    assert summary["headline"] == "ensemble"
    assert summary["accuracy"] == summary["final"]["global"]["ensemble"] > 0.5


def _linear_family():
    from torch import nn

    from hetfl.models import ArchSpec, ModelFamily, MultiExitModel

    def builder(input_shape, num_classes, *, width, depth, norm):
        d = input_shape[0]
        return MultiExitModel(nn.Identity(), [nn.Linear(d, d) for _ in range(depth)],
                              [nn.Linear(d, num_classes) for _ in range(depth)], tuple(range(depth)))

    return ModelFamily("lin", (3, 1, 1), 2, ArchSpec(3, (0, 1, 2)), builder)


def test_depthfl_client_update_equals_the_written_out_objective():
    """Eq. (1) + Eq. (2) written as one explicit loss, SGD with weight decay over two epochs; then Eq. (3).

    A depth-2 client of a depth-3 model: its FedDyn state keeps global shape and block 3 stays untouched.
    """
    import torch.nn.functional as F

    from hetfl.methods.depthfl import DepthFL
    from hetfl.seeding import torch_generator
    from hetfl.client import client_update
    from hetfl.trainers.schedule import ClientData, batches

    fam = _linear_family()
    alpha, lr, wd = 0.1, 0.1, 1e-3
    cfg = config_from({"method": "depthfl", "feddyn_alpha": alpha, "lr": lr, "momentum": 0.0, "weight_decay": wd,
                       "batch_size": 4, "num_clients": 4, "levels": 3, "local_epochs": 2, "kd_ramp": 0.0})  # KD weight 1
    method = DepthFL(cfg, fam, num_levels=3)
    server = method.init_state(0)
    g = server.params
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 3, generator=gen), torch.randint(0, 2, (10,), generator=gen)
    spec = SubModel(depth=2)
    w0 = extract(g, method.models.shapes(spec))
    prev = {n: 0.05 * torch.randn(t.shape, generator=gen) for n, t in g.items()}  # g_k in global shape
    task = method.task(server, spec, client=0, round_index=5)
    update, new = client_update(w0, task, ClientData(x, y, torch.arange(10)), dict(prev), models=method.models)

    model = fam.build(depth=2)
    model.load_state_dict(w0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    generator = torch_generator(0, "train", 5, 0)
    for _ in range(2):
        for b in batches(10, 4, generator):
            out = model(x[b])
            loss = sum(F.cross_entropy(o, y[b]) for o in out)
            for i, o in enumerate(out):  # Eq. (1): 1/(d_k - 1) sum_{j != i} KL(p_j || p_i), p_j a constant
                for j in range(len(out)):
                    if j != i:
                        p_j = F.softmax(out[j].detach(), 1)
                        loss = loss + (p_j * (p_j.log() - F.log_softmax(o, 1))).sum(1).mean() / (len(out) - 1)
            for n, p in model.named_parameters():  # Eq. (2): - <g_k, theta> + alpha/2 ||theta - theta^t||^2
                loss = loss - (p * prev[n]).sum() + alpha / 2 * ((p - w0[n]) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    for n, p in model.named_parameters():
        assert torch.allclose(update.state[n], p.detach(), atol=1e-6), n
        assert torch.allclose(new[n], prev[n] - alpha * (p.detach() - w0[n]), atol=1e-6), n  # Eq. (3)
    for n in g:
        if n not in w0:
            assert torch.equal(new[n], prev[n]), n  # the deeper block's slice is kept as it was


def test_depthfl_server_follows_algorithm_1_over_rounds_with_unheld_blocks():
    """Three rounds, depths {1, 2, 2, 3}, then {1, 1} (blocks 2-3 unheld), then {1, 2, 2, 3}; by hand:
    per element, h <- h - alpha/m sum_k (theta_k - theta) over its holders, theta <- mean - h/alpha."""
    from hetfl.client import Update
    from hetfl.methods.depthfl import DepthFL

    fam = _linear_family()
    alpha = 0.1
    cfg = config_from({"method": "depthfl", "feddyn_alpha": alpha, "num_clients": 4, "levels": 3,
                            "aggregation_weights": "samples"})  # FedDyn averages uniformly whatever this says
    method = DepthFL(cfg, fam, num_levels=3)
    g = method.init_state(0)
    ref, h = {k: v.clone() for k, v in g.params.items()}, {k: torch.zeros_like(v) for k, v in g.params.items()}
    gen = torch.Generator().manual_seed(3)
    for depths in ([1, 2, 2, 3], [1, 1], [1, 2, 2, 3]):
        updates = []
        for client, depth in enumerate(depths):
            local = extract(g.params, method.models.shapes(SubModel(depth=depth)))
            local = {k: v + torch.randn(v.shape, generator=gen) for k, v in local.items()}
            updates.append(Update(client, SubModel(depth=depth), local, num_samples=10 * (client + 1)))
        g = method.aggregate(g, iter(updates))
        for k in ref:
            holders = [u.state[k] for u in updates if k in u.state]
            if holders:
                h[k] = h[k] - alpha / cfg.num_clients * sum(t - ref[k] for t in holders)
                ref[k] = sum(holders) / len(holders) - h[k] / alpha
        for k in ref:
            assert torch.allclose(g.params[k], ref[k], atol=1e-5), k


def test_exclusive_learning_with_feddyn_counts_only_the_eligible_clients():
    from hetfl.methods.exclusivefl import ExclusiveFL

    fam = model_family("cnn", (1, 28, 28), 10, width=0.125)
    for level, eligible in ((1, 100), (2, 75), (4, 25)):
        cfg = config_from({"method": "exclusivefl", "global_level": level, "server_opt": "feddyn",
                                "kd_weight": 1.0, "inference": "ensemble"})
        method = ExclusiveFL(cfg, fam, num_levels=4)
        assert method.server.num_clients == eligible
        assert method.inference == "ensemble"
    maximum = config_from({"method": "exclusivefl", "global_level": 4, "server_opt": "feddyn", "scenario": "maximum"})
    assert ExclusiveFL(maximum, fam, num_levels=4).server.num_clients == 100
