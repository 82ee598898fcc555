"""Batched augmentation: seeded, identity when off, real flips and real crops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetfl.augment import augment
from hetfl.errors import HetflError


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def x() -> torch.Tensor:
    """64 random 3x6x5 images (non-square, so rows and columns cannot be mixed up)."""
    return torch.randn(64, 3, 6, 5, generator=gen(0))


def test_off_is_identity(x):
    assert augment(x, gen(1)) is x
    assert augment(x, gen(1), crop_padding=0, flip=False) is x


def test_same_generator_state_same_output(x):
    a = augment(x, gen(7), crop_padding=2, flip=True)
    assert torch.equal(a, augment(x, gen(7), crop_padding=2, flip=True))
    assert not torch.equal(a, augment(x, gen(8), crop_padding=2, flip=True))


def test_flip_mirrors_some_samples(x):
    out = augment(x, gen(3), flip=True)
    flipped = [torch.equal(o, s.flip(-1)) for o, s in zip(out, x)]
    kept = [torch.equal(o, s) for o, s in zip(out, x)]
    assert all(f != k for f, k in zip(flipped, kept))  # each sample is exactly one of the two
    assert 10 < sum(flipped) < 54


def test_crop_is_a_window_of_the_padded_image(x):
    p = 2
    out = augment(x, gen(4), crop_padding=p)
    assert out.shape == x.shape
    padded = F.pad(x, (p, p, p, p))
    offsets = set()
    for o, s in zip(out, padded):
        matches = [(i, j) for i in range(2 * p + 1) for j in range(2 * p + 1) if torch.equal(o, s[:, i:i + 6, j:j + 5])]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 10  # offsets really vary per sample
    assert (out == 0).any()  # some windows include the zero border


def test_crop_then_flip_keeps_shape(x):
    assert augment(x, gen(5), crop_padding=4, flip=True).shape == x.shape


def test_negative_padding():
    with pytest.raises(HetflError, match="crop_padding must be >= 0, got -1"):
        augment(torch.zeros(1, 1, 2, 2), gen(0), crop_padding=-1)
