"""MSDNet-24 (Huang et al., ICLR 2018; ScaleFL Sec. 4.3): the CIFAR configuration, exits and scales at every depth,
width slices that keep the leading share of every dense chunk (weight for weight and logit for logit), costs."""

import zlib

import pytest
import torch

from hetfl.costs import count_macs, measure
from hetfl.models import model_family
from hetfl.models.base import federated_state
from hetfl.models.cache import ModelCache
from hetfl.models.msdnet import CIFAR, layer_scales, layout
from hetfl.slicing import SubModel, extract, narrowed, scatter

DIGITS = (1, 8, 8)


def test_layout_is_huangs_cifar_configuration():
    """3 scales of 16/32/64 channels; growth 6 x (1, 2, 4); scales dropped after layers 8 and 16, each drop ending in
    a transition to floor(0.5 C): C = 16 + 9 x 6 = 70 -> 35, then 35 + 8 x 6 = 83 -> 41; the last exit reads
    (41 + 7 x 6) x 4 = 332 channels of the coarsest scale."""
    stem, layers = layout()
    assert stem == (16, 32, 64) and len(layers) == 24
    assert [layer_scales(n, CIFAR)[1] for n in (1, 8, 9, 16, 17, 24)] == [3, 3, 2, 2, 1, 1]
    assert [n for n, layer in enumerate(layers, 1) if layer.transition] == [9, 17]
    assert [out for _, out in layers[8].transition.convs] == [70, 140] and layers[16].transition.convs[0][1] == 164
    first = layers[0].units
    finest, coarsest = first[0], first[2]
    assert finest.down is None and (finest.normal.chunks, finest.normal.inner, finest.normal.out) == ((16,), 6, 6)
    assert (coarsest.down.chunks, coarsest.down.inner, coarsest.normal.inner, coarsest.normal.out) == ((32,), 24, 48, 12)
    assert layers[1].units[1].normal.chunks == (32, 6, 6)  # scale 2's input after one layer: stem + down + normal
    assert sum(layers[23].exit_chunks) == 332 and layers[23].exit_chunks == (164,) + (24,) * 7


def test_full_model_has_the_reference_implementations_size():
    """Huang et al.'s PyTorch code (kalviny/MSDNet-PyTorch), configured as the ScaleFL authors' msdnet24_4 (4 blocks,
    base 6, step 6), builds 2,503,708 parameters and 99,091,456 MACs through its 4 classifiers on a CIFAR-10 image
    (measured with the same FLOP counter); hetfl's msdnet24 at width 1 is the same network."""
    fam = model_family("msdnet24", (3, 32, 32), 10)
    model = fam.build(seed=0)
    assert fam.arch.num_blocks == 24 and fam.arch.exit_after == (5, 11, 17, 23)
    assert sum(p.numel() for p in model.parameters()) == 2_503_708
    assert [sum(p.numel() for p in e.parameters()) for e in model.exits] == [388_874, 393_482, 365_834, 531_722]
    assert count_macs(model, (3, 32, 32)) == 99_091_456


@pytest.mark.parametrize("shape", [DIGITS, (1, 28, 28), (3, 32, 32)])
def test_exits_and_scales_at_every_cut(shape):
    fam = model_family("msdnet24", shape, 10)
    x = torch.randn(3, *shape)
    for depth, width in ((1, 1.0), (6, 0.25), (9, 1.0), (12, 0.5), (17, 0.25), (24, 0.7)):
        model = fam.build(depth=depth, width=width, seed=0)
        logits = model(x)
        assert len(logits) == fam.exits_at_depth(depth) == sum(b < depth for b in (5, 11, 17, 23))
        assert all(z.shape == (3, 10) for z in logits)
        scales = [len(h) for _, h in model.hidden(x)]
        assert scales == [3] * min(depth, 8) + [2] * min(max(depth - 8, 0), 8) + [1] * max(depth - 16, 0)
    sizes = [tuple(h.shape[2:]) for h in model.stem(x)]
    assert sizes[0] == shape[1:] and sizes[-1] == tuple((s + 3) // 4 for s in shape[1:])  # strides 1, 2, 2


def fill_by_identity(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter element set from the identities of its channels, whatever the model's width: an output channel
    is its index, an input channel of a dense layer (its ``in_chunks`` mark) is (chunk, index in the chunk)."""
    for name, module in model.named_modules():
        for kind, p in module.named_parameters(recurse=False):
            seed = zlib.crc32(f"{name}.{kind}".encode()) % 1000
            ids = [torch.arange(n, dtype=torch.float64) for n in p.shape]
            chunks = getattr(module, "in_chunks", None)
            if chunks and kind == "weight":
                ids[1] = torch.cat([1000.0 * j + torch.arange(n, dtype=torch.float64) for j, n in enumerate(chunks)])
            code = sum((7.3 + 3.1 * d) * i.view([-1 if e == d else 1 for e in range(p.dim())])
                       for d, i in enumerate(ids))
            with torch.no_grad():
                p.copy_(torch.sin(seed + code).to(p.dtype).expand(p.shape))
    return model


@pytest.mark.parametrize("width", [0.25, 0.5, 0.7])
def test_width_slice_is_the_narrow_model_weight_for_weight(width):
    fam = model_family("msdnet24", DIGITS, 10)
    full = federated_state(fill_by_identity(fam.build(seed=0)))
    narrow = federated_state(fill_by_identity(fam.build(width=width, seed=0)))
    spec = SubModel(depth=24, width=width, chunks=fam.chunks)
    cut = extract(full, {n: t.shape for n, t in narrow.items()}, spec)
    assert cut.keys() == narrow.keys()
    assert all(torch.equal(cut[n], narrow[n]) for n in narrow)
    leading_corners = extract(full, {n: t.shape for n, t in narrow.items()}, SubModel(depth=24, width=width))
    assert not all(torch.equal(leading_corners[n], narrow[n]) for n in narrow)  # what the chunks are for


@pytest.mark.parametrize("width", [0.25, 0.7])
def test_width_slice_computes_what_the_global_model_computes_on_it(width):
    """The narrow model holding a slice gives the logits of the global model whose every element outside the slice is
    zero (its other channels stay 0 through BN and ReLU); a slice of leading corners would not."""
    fam = model_family("msdnet24", DIGITS, 10)
    cache = ModelCache(fam)
    glob = federated_state(fam.build(seed=0))
    x = torch.randn(16, *DIGITS, generator=torch.Generator().manual_seed(0))

    def outputs(spec, load):
        local = extract(glob, cache.shapes(spec) if spec.chunks else load, spec)
        narrow = cache.module(spec)
        narrow.load_state_dict(local, strict=False)
        zeroed = fam.build(seed=0)
        zeroed.load_state_dict({k: v for k, (v, _) in scatter(local, glob, spec).items()})
        return narrow.train()(x), zeroed.train()(x)

    spec = SubModel(depth=24, width=width, chunks=fam.chunks)
    narrow, zeroed = outputs(spec, None)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(narrow, zeroed))
    corners = SubModel(depth=24, width=width)
    narrow, zeroed = outputs(corners, cache.shapes(spec))
    assert not all(torch.allclose(a, b, atol=1e-3) for a, b in zip(narrow, zeroed))


def test_a_nested_width_is_cut_from_a_wider_ones_tensors():
    """SHeteroFL and FjORD run a narrower width on a wider client's tensors: the same tensors as cut from the global
    model."""
    fam = model_family("msdnet24", DIGITS, 10)
    cache, glob = ModelCache(fam), federated_state(fam.build(seed=0))
    half, quarter = (SubModel(depth=24, width=w, chunks=fam.chunks) for w in (0.5, 0.25))
    within = narrowed(extract(glob, cache.shapes(half), half), cache.shapes(quarter), quarter)
    direct = extract(glob, cache.shapes(quarter), quarter)
    assert all(torch.equal(within[n], direct[n]) for n in direct)


def test_a_narrow_spec_without_the_chunks_is_refused():
    fam = model_family("msdnet24", DIGITS, 10)
    with pytest.raises(ValueError, match="lacks its dense layers' chunks"):
        ModelCache(fam).shapes(SubModel(depth=24, width=0.5))
    assert ModelCache(fam).shapes(SubModel(depth=24))  # width 1 takes whole tensors: nothing to cut


def test_costs_grow_with_width_and_depth():
    fam = model_family("msdnet24", DIGITS, 10)
    grid = {(d, w): measure(fam, SubModel(depth=d, width=w, chunks=fam.chunks), batch_size=8)
            for d in (6, 12, 24) for w in (0.25, 0.5, 1.0)}
    for field in ("params", "macs", "train_memory", "bytes_down"):
        for d in (6, 12, 24):
            row = [getattr(grid[d, w], field) for w in (0.25, 0.5, 1.0)]
            assert row == sorted(set(row)), (field, d, row)
        for w in (0.25, 0.5, 1.0):
            column = [getattr(grid[d, w], field) for d in (6, 12, 24)]
            assert column == sorted(set(column)), (field, w, column)
