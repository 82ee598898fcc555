"""ResNet-18/34 with DepthFL's exits: Table 1's sizes, the depth and width contracts."""

import torch

from hetfl.costs import count_macs, count_params
from hetfl.models import model_family
from hetfl.slicing import corner


def test_resnet18_depth_models_match_depthfl_table1_parameters():
    fam = model_family("resnet18", (3, 32, 32), 100)
    counts = [count_params(fam.build(depth=d)) for d in (1, 2, 3, 4)]
    assert counts == [479_652, 1_347_336, 3_838_316, 12_283_344]  # Table 1: 480K / 1.35M / 3.84M / 12.3M


def test_resnet18_macs_within_two_percent_of_table1():
    """PyTorch's counter skips element-wise work (BN, ReLU, attention products): a little below the paper."""
    fam = model_family("resnet18", (3, 32, 32), 100)
    for depth, paper in zip((1, 2, 3, 4), (167e6, 310e6, 450e6, 585e6)):
        macs = count_macs(fam.build(depth=depth), (3, 32, 32))
        assert 0.98 * paper < macs <= paper


def test_resnet_depth_and_width_contracts():
    fam = model_family("resnet34", (1, 28, 28), 10)
    full = fam.build().state_dict()
    for depth in (1, 3):
        for width in (0.25, 1.0):
            local = fam.build(depth=depth, width=width).state_dict()
            assert set(local) <= set(full)
            assert all(full[n][corner(t.shape)].shape == t.shape for n, t in local.items())
    quarter = fam.build(width=0.25)
    assert quarter.stem[0].weight.shape == (16, 1, 3, 3)
    assert [l.shape for l in quarter(torch.randn(2, 1, 28, 28))] == [(2, 10)] * 4


def test_shallow_exits_equal_the_full_models_first_exits():
    fam = model_family("resnet18", (3, 32, 32), 10, width=0.125)
    full, shallow = fam.build(seed=0), fam.build(depth=2)
    shallow.load_state_dict({n: t for n, t in full.state_dict().items() if n in shallow.state_dict()})
    x = torch.randn(4, 3, 32, 32)
    full.eval(), shallow.eval()
    a, b = full(x), shallow(x)
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
