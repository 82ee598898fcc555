"""Width slices of dense layers: a layer reading a concatenation of chunks keeps the leading share of every chunk
(slicing.SubModel.chunks), in extraction, scatter, FedRolex's rolling window and the masked mean; by hand."""

import json

import pytest
import torch

from hetfl.aggregation import MaskedMean
from hetfl.slicing import SubModel, chunk_sizes, corner, extract, narrowed, scatter, window


def test_chunk_sizes_round_every_chunk_at_one_width():
    assert chunk_sizes((16, 6, 6), 28) == (16, 6, 6)
    assert chunk_sizes((16, 6, 6), 14) == (8, 3, 3)  # width 1/2
    assert chunk_sizes((16, 6, 6), 8) == (4, 2, 2)  # width 1/4: ceil(1.5) = 2
    assert chunk_sizes((16, 6, 6), 3) == (1, 1, 1)  # the narrowest: one channel each
    assert chunk_sizes((32, 6, 6, 12), 33) == (18, 4, 4, 7)  # width 0.55 (any width in (17/32, 7/12] alike)
    with pytest.raises(ValueError, match="11 channels are no width of chunks"):
        chunk_sizes((16, 6, 6), 11)  # (4, 3, 3) needs a width above 1/3, where 16 already gives 6: 10, then 12


def test_window_takes_the_leading_share_of_every_chunk():
    """Input channels of chunks (4, 2, 2) at width 1/2 are (2, 1, 1): global channels 0, 1 | 4 | 6."""
    idx = window((3, 8), (2, 4), chunks={1: (4, 2, 2)})
    assert idx[0].flatten().tolist() == [0, 1] and idx[1].flatten().tolist() == [0, 1, 4, 6]
    w = torch.arange(24.).view(3, 8)
    assert w[idx].tolist() == [[0, 1, 4, 6], [8, 9, 12, 14]]
    assert window((3, 8), (2, 4)) == corner((2, 4))  # without chunks: the leading corner, as before
    assert window((3, 8), (3, 8), chunks={1: (4, 2, 2)}) == corner((3, 8))  # the whole tensor stays a view


def test_rolling_window_rolls_inside_every_chunk():
    """FedRolex's offset 3 on chunks (4, 2): chunk 0 holds 3, 0; chunk 1 holds 4 + (3 mod 2) = 5."""
    idx = window((6,), (3,), offset=3, chunks={0: (4, 2)})
    assert idx[0].tolist() == [3, 0, 5]


def test_extract_scatter_and_narrowing_follow_the_chunks():
    spec = SubModel(depth=1, width=0.5, chunks=(("conv.weight", 1, (4, 2, 2)),))
    g = {"conv.weight": torch.arange(16.).view(2, 8), "bn.weight": torch.arange(2.)}
    local = extract(g, {"conv.weight": torch.Size([1, 4]), "bn.weight": torch.Size([1])}, spec)
    assert local["conv.weight"].tolist() == [[0, 1, 4, 6]] and local["bn.weight"].tolist() == [0]
    value, mask = scatter(local, g, spec)["conv.weight"]
    assert mask.tolist() == [[True, True, False, False, True, False, True, False], [False] * 8]
    assert value[mask].tolist() == [0, 1, 4, 6]
    # a narrower width read from a wider one's tensors (SHeteroFL, FjORD): chunks (2, 1, 1) -> (1, 1, 1), local
    # channels 0, 2, 3, which are global 0, 4, 6: what the narrower width cut from the global tensor holds
    quarter = SubModel(depth=1, width=0.25, chunks=spec.chunks)
    assert narrowed(local, {"conv.weight": torch.Size([1, 3])}, quarter)["conv.weight"].tolist() == [[0, 4, 6]]
    assert extract(g, {"conv.weight": torch.Size([1, 3])}, quarter)["conv.weight"].tolist() == [[0, 4, 6]]


def test_masked_mean_of_two_widths_on_a_dense_conv_by_hand():
    """A 1x1 conv with 2 outputs reading chunks (2, 1, 1). Client A (width 1) sends 1s, client B (width 1/2: 1 output,
    chunks (1, 1, 1), global inputs 0, 2, 3) sends 3s, equal weights. Output 0 at inputs 0, 2, 3 is held by both:
    (1 + 3) / 2 = 2; input 1 and output 1 only by A: 1. The BN weight of output 0: (1 + 3) / 2."""
    chunks = (("reduce.weight", 1, (2, 1, 1)),)
    g = {"reduce.weight": torch.zeros(2, 4, 1, 1), "norm.weight": torch.zeros(2)}
    agg = MaskedMean(g)
    agg.add({"reduce.weight": torch.ones(2, 4, 1, 1), "norm.weight": torch.ones(2)}, 1.0,
            SubModel(depth=1, chunks=chunks))
    agg.add({"reduce.weight": torch.full((1, 3, 1, 1), 3.0), "norm.weight": torch.full((1,), 3.0)}, 1.0,
            SubModel(depth=1, width=0.5, chunks=chunks))
    conv, held = agg.mean()["reduce.weight"]
    assert conv[0].flatten().tolist() == [2.0, 1.0, 2.0, 2.0] and conv[1].flatten().tolist() == [1.0] * 4
    assert bool(held.all()) and agg.mean()["norm.weight"][0].tolist() == [2.0, 1.0]
    assert agg.weights["reduce.weight"][0].flatten().tolist() == [2.0, 1.0, 2.0, 2.0]


def test_a_spec_with_chunks_travels_as_json():
    spec = SubModel(depth=3, width=0.5, chunks=(("blocks.0.a.weight", 1, (16, 6)), ("exits.0.b.weight", 1, (4, 2))))
    assert SubModel.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert SubModel.from_dict({"depth": 3, "width": 0.5}).chunks == ()  # specs written before chunks existed
