"""Width scaling: corner slicing of a conv + BN + linear stack, nested masks, Scaler, static BN, SHeteroFL."""

import torch
import torch.nn.functional as F
from torch import nn

from hetfl.aggregation import FedAvgServer, MaskedMean, ServerState
from hetfl.models.cache import attach_scaler
from hetfl.trainers.objectives import objective_for
from hetfl.methods import config_from
from hetfl.evaluate import static_batchnorm
from hetfl.methods.heterofl import HeteroFL, SHeteroFL
from hetfl.models import model_family
from hetfl.slicing import extract


def test_width_extract_slices_channels_but_not_image_channels_or_classes():
    fam = model_family("cnn", (1, 28, 28), 10, width=1 / 16)  # global channels 4/8/16/32
    g = fam.build(seed=0).state_dict()
    shapes = {n: t.shape for n, t in fam.build(width=0.5).state_dict().items()}
    local = extract(g, shapes)
    assert torch.equal(local["blocks.0.0.weight"], g["blocks.0.0.weight"][:2, :1])  # conv 1 -> 2: image channel kept
    assert torch.equal(local["blocks.1.0.weight"], g["blocks.1.0.weight"][:4, :2])  # conv 2 -> 4
    assert torch.equal(local["blocks.1.1.weight"], g["blocks.1.1.weight"][:4])  # BN affine
    assert torch.equal(local["exits.3.2.weight"], g["exits.3.2.weight"][:10, :16])  # Linear 16 -> 10 classes
    assert torch.equal(local["exits.3.2.bias"], g["exits.3.2.bias"])


def test_nested_masks_three_levels_by_hand():
    """Uniform weights, widths 1/4, 1/2, 1 of a 4x4 tensor holding 1, 2, 4."""
    g = {"w": torch.zeros(4, 4)}
    agg = MaskedMean(g)
    for side, value in ((1, 1.0), (2, 2.0), (4, 4.0)):
        agg.add({"w": torch.full((side, side), value)}, weight=1.0)
    new = FedAvgServer().step(ServerState(g), agg).params["w"]
    expected = torch.full((4, 4), 4.0)
    expected[:2, :2] = 3.0
    expected[0, 0] = 7 / 3
    assert torch.allclose(new, expected)
    assert agg.weights["w"][0, 0] == 3 and agg.weights["w"][1, 1] == 2 and agg.weights["w"][3, 3] == 1


def test_scaler_divides_the_input_of_normalisation_in_training_only():
    """Without BatchNorm the Scaler sits where BN would: block 1 = conv -> [/0.5] -> ReLU -> pool."""
    fam = model_family("cnn", (1, 8, 8), 10, width=1 / 16, norm="none")
    model, ref = fam.build(depth=1, width=0.5), fam.build(depth=1, width=0.5)
    ref.load_state_dict(model.state_dict())
    attach_scaler(model, 0.5)
    x = torch.randn(3, 1, 8, 8)
    model.train(), ref.train()
    assert torch.allclose(model.blocks[0](x), ref.blocks[0](x) / 0.5)
    model.eval(), ref.eval()
    assert torch.equal(model.blocks[0](x), ref.blocks[0](x))


def test_scaler_leaves_batch_normalised_networks_unchanged_even_with_residual_sums():
    """BN with batch statistics is invariant to the scale of its input: the Scaler must not touch a residual
    branch that reaches a sum without BN (PreResNet's conv2), or training would run another function."""
    fam = model_family("preresnet20", (3, 16, 16), 10)
    model, ref = fam.build(width=0.5, seed=0), fam.build(width=0.5, seed=0)
    attach_scaler(model, 0.5)
    x = torch.randn(4, 3, 16, 16)
    model.train(), ref.train()
    a, b = model(x)[-1], ref(x)[-1]
    assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)


def test_static_bn_uses_statistics_of_the_given_data():
    bn = nn.BatchNorm1d(3, track_running_stats=False)
    model = nn.Sequential(bn)
    x = torch.randn(50, 3) * 2 + 1
    with static_batchnorm(model, x):
        assert not model.training
        out = model(torch.ones(1, 3))
        mean, var = x.mean(0), x.var(0, unbiased=True)
        assert torch.allclose(out, (1 - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias, atol=1e-5)
    assert bn.running_mean is None and not bn.track_running_stats  # batch statistics again afterwards
    assert torch.allclose(model.train()(x).mean(0), torch.zeros(3), atol=1e-5)


def test_static_bn_pools_exact_statistics_over_several_chunks():
    """Chunks of different means: the pooled variance holds the spread between them (an average of the
    chunks' variances would not), and it does not depend on the chunk size."""
    bn = nn.BatchNorm2d(2, track_running_stats=False)
    x = torch.cat([torch.randn(7, 2, 3, 3) - 4, torch.randn(7, 2, 3, 3) + 4])  # two chunks of 7, means -4 and 4
    with static_batchnorm(nn.Sequential(bn), x, chunk=7):
        mean, var = bn.running_mean.clone(), bn.running_var.clone()
    flat = x.transpose(0, 1).reshape(2, -1).double()
    assert torch.allclose(mean.double(), flat.mean(1), atol=1e-6)
    assert torch.allclose(var.double(), flat.var(1, unbiased=True), rtol=1e-5)
    assert var.min() > 10  # ~1 within a chunk + 16 between them
    with static_batchnorm(nn.Sequential(bn), x, chunk=3):
        assert torch.allclose(bn.running_var, var, rtol=1e-5)


def test_static_bn_on_channels_last_input_keeps_its_layout_and_near_exact_statistics():
    """A 1-channel image makes the CNN run channels-last on a CPU; the pass keeps that layout (converting
    would cost more than the statistics) and BatchNorm's own statistics stay within 1e-3 of exact."""
    bn = nn.BatchNorm2d(4, track_running_stats=False)
    x = (torch.randn(600, 4, 8, 8) * 0.3 + 2).contiguous(memory_format=torch.channels_last)
    seen = []
    model = nn.Sequential(bn, nn.Flatten())
    bn.register_forward_hook(lambda m, i, o: seen.append(o.is_contiguous(memory_format=torch.channels_last)))
    with static_batchnorm(model, x, chunk=200):
        mean, var = bn.running_mean.double(), bn.running_var.double()
    flat = x.transpose(0, 1).reshape(4, -1).double()
    assert torch.allclose(mean, flat.mean(1), rtol=1e-4, atol=1e-5)
    assert torch.allclose(var, flat.var(1, unbiased=True), rtol=1e-3)
    assert seen == [True, True, True]


def make(method_cls, **cfg):
    fam = model_family("cnn", (1, 8, 8), 10, width=1 / 16)
    c = config_from({"method": method_cls.name, **cfg})
    method = method_cls(c, fam, num_levels=4)
    return method, method.init_state(seed=0).params


def test_heterofl_plans_widths_per_level_and_evaluates_every_width():
    method, _ = make(HeteroFL)
    from hetfl.devices import Budget

    assert [method.plan(0, Budget(level=l), 1).width for l in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert method.plan(0, Budget(level=1), 1).exits == (4,)
    assert list(method.eval_specs()) == ["global", "width0.25", "width0.5", "width0.75"]


def test_sheterofl_loss_adds_every_smaller_width_on_shared_slices():
    method, g = make(SHeteroFL, scaler=False)
    spec = method.width_spec(0.5)
    model = method.models.loaded(spec, extract(g, method.models.shapes(spec)))
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    loss, _ = objective_for(method.recipe(spec, 1), method.models)(model, dict(model.named_parameters()), x, y, None)
    small = method.models.loaded(method.width_spec(0.25), extract(g, method.models.shapes(method.width_spec(0.25))))
    expected = F.cross_entropy(model(x)[0], y) + F.cross_entropy(small(x)[0], y)
    assert torch.allclose(loss, expected, atol=1e-6)
    loss.backward()
    grad = model.blocks[0][0].weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_heterofl_learns_digits(tiny_cfg):
    from hetfl.sim import Simulation

    summary = Simulation(tiny_cfg(method="heterofl", rounds=6, client_fraction=0.5, model_width=0.5)).run(progress=False)
    assert set(summary["final"]) == {"global", "width0.25", "width0.5", "width0.75"}
    assert summary["accuracy"] > 0.5


def test_static_bn_on_a_seeded_subset(tiny_cfg):
    from hetfl.sim import Simulation

    a = Simulation(tiny_cfg(method="heterofl", static_bn_samples=100))
    b = Simulation(tiny_cfg(method="heterofl", static_bn_samples=100))
    assert len(a.x_bn) == 100 and torch.equal(a.x_bn, b.x_bn)
    assert len(Simulation(tiny_cfg(method="heterofl", static_bn_samples=0)).x_bn) == len(a.x_train)  # 0 = all
