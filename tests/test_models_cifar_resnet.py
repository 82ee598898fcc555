"""CIFAR ResNets (ResNet-110, PreResNet-20): sizes by hand, exits anywhere, depth and width contracts."""

import copy
from contextlib import contextmanager

import pytest
import torch

from hetfl.errors import HetflError
from hetfl.models import model_family
from hetfl.models.cifar_resnet import shortcut
from hetfl.slicing import corner


def test_resnet110_parameter_count_by_hand():
    """Stem 464 + stage 1 18 x 4,672 + stage 2 14,528 + 17 x 18,560 + stage 3 57,728 + 17 x 73,984 + fc 650."""
    fam = model_family("resnet110", (3, 32, 32), 10, exit_after=(53,))
    expected = 464 + 18 * 4672 + (14528 + 17 * 18560) + (57728 + 17 * 73984) + 650
    assert sum(p.numel() for p in fam.build().parameters()) == expected == 1_730_714


def test_scalefl_exit_heads_and_positions():
    fam = model_family("resnet110", (3, 32, 32), 100, exit_after=(29, 37, 45, 53))
    model = fam.build()
    assert len(model.blocks) == 54 and model.exit_after == (29, 37, 45, 53)
    head = model.exits[0]
    assert sum(isinstance(m, torch.nn.Conv2d) for m in head.modules()) == 3  # 3 x (conv, BN, ReLU) + pool + fc
    assert [l.shape for l in model(torch.randn(2, 3, 32, 32))] == [(2, 100)] * 4
    shallow = fam.build(depth=38)
    assert shallow.exit_after == (29, 37) and set(shallow.state_dict()) <= set(model.state_dict())


def test_preresnet20_blocks_and_width_corners():
    fam = model_family("preresnet20", (3, 32, 32), 10)
    full = fam.build().state_dict()
    assert fam.arch.num_blocks == 9 and fam.arch.exit_after == (2, 5, 8)
    half = fam.build(depth=6, width=0.5).state_dict()
    for name, t in half.items():
        assert full[name][corner(t.shape)].shape == t.shape
    assert half["stem.0.weight"].shape == (8, 3, 3, 3)  # image channels kept
    assert half["exits.1.4.weight"].shape == (10, 16)  # class dimension kept (BN, ReLU, pool, flatten, fc)


def test_bad_exit_positions():
    with pytest.raises(HetflError, match="exits of resnet110 must be increasing blocks"):
        model_family("resnet110", (3, 32, 32), 10, exit_after=(10, 5, 53))
    with pytest.raises(HetflError, match="ending with the last block 53"):
        model_family("resnet110", (3, 32, 32), 10, exit_after=(10, 20))


def test_depth_levels_end_at_exits():
    from hetfl.config import Config
    from hetfl.methods.depthfl import DepthFL

    fam = model_family("resnet110", (3, 32, 32), 10)  # exits after blocks 17, 35, 53
    method = DepthFL(Config(levels=3), fam, num_levels=3)
    assert [method.depth_for_level(l) for l in (1, 2, 3)] == [18, 36, 54]


@contextmanager
def num_threads(n: int):
    """torch's intra-op threads set to ``n`` inside, restored after (kernels can differ by thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("in_ch", [4, 6, 16])
def test_strided_shortcut_matches_float64(in_ch, threads):
    """The 1x1 stride-2 shortcut on a channels-last batch (the width-0.34 PreResNet-20's has 6 input channels):
    output and both gradients as a float64 strided convolution gives them, at one and two threads. oneDNN's
    AVX2 strided 1x1 kernel aborted the process here with one thread and was off by 200 in the weight gradient
    with two (``SubsampledPointwiseConv``)."""
    conv = shortcut(in_ch, 2 * in_ch - 1, 2, "bn")[0].to(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(in_ch)
    x = torch.randn(32, in_ch, 28, 28, generator=gen).to(memory_format=torch.channels_last).requires_grad_()
    g = torch.randn(32, 2 * in_ch - 1, 14, 14, generator=gen)
    x64 = x.detach().double().requires_grad_()
    w64 = conv.weight.detach().double().requires_grad_()
    ref = torch.nn.functional.conv2d(x64, w64, None, 2)
    ref.backward(g.double())
    with num_threads(threads):
        out = conv(x)
        out.backward(g)
    for got, want in ((out, ref), (x.grad, x64.grad), (conv.weight.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name, width", [("preresnet20", 0.34), ("resnet18", 1 / 16)])
def test_narrow_resnet_gradients_match_float64(name, width, threads):
    """A whole training step's gradients of the narrowest models the presets train (6 and 4 channels in the first
    stage), as float32 on this machine's kernels at one and two threads against the same step in float64: a guard
    against a CPU kernel that is wrong on the hardware at hand, as oneDNN's strided 1x1 was.

    The ReLUs become GELUs: float32 rounding (~1e-5 after 16 layers) can put a pre-activation within that of
    zero on the other side of a ReLU's kink than float64 does, and that one element's whole upstream gradient
    then differs (seen on an AVX-512 EPYC at one thread: 1 of 8,192 activations, -9.3e-6 against +1.3e-6,
    1-9% off in every earlier layer's gradient). A smooth activation keeps the comparison about the kernels."""
    fam = model_family(name, (1, 28, 28), 10)
    model = fam.build(width=width, seed=0).train()
    for parent in list(model.modules()):
        for child_name, child in parent.named_children():
            if isinstance(child, torch.nn.ReLU):
                setattr(parent, child_name, torch.nn.GELU())
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(1)).to(memory_format=torch.channels_last)
    y = torch.arange(16) % 10

    def grads(m, inputs):
        loss = sum(torch.nn.functional.cross_entropy(logits, y) for logits in m(inputs))
        return torch.autograd.grad(loss, list(m.parameters()))

    want = grads(copy.deepcopy(model).double(), x.double())
    with num_threads(threads):
        got = grads(model, x)
    for (pname, _), g, w in zip(model.named_parameters(), got, want):
        err = float((g.double() - w).abs().max())
        assert err <= 1e-2 * float(w.abs().max()) + 1e-5, f"{pname}: {err:.3g} off"  # rounding: ~1e-3
