"""Device scenarios, level counts, learning-rate schedules."""

import math

import numpy as np
import pytest

from hetfl.config import Config
from hetfl.methods import config_from
from hetfl.devices import Scenario, level_counts
from hetfl.errors import HetflError


def test_level_counts_follow_proportions():
    assert level_counts(100, [1, 1, 1, 1]) == [25, 25, 25, 25]
    assert level_counts(100, [1, 2, 7]) == [10, 20, 70]
    assert level_counts(10, [1, 1, 1]) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    assert sum(level_counts(7, [0.3, 0.3, 0.4])) == 7


@pytest.mark.parametrize("props,fragment", [([-1, 2], ">= 0"), ([0, 0], "sum to zero"), ([1, 1000], "no client")])
def test_bad_proportions(props, fragment):
    with pytest.raises(HetflError, match=fragment):
        level_counts(10, props)


def test_fixed_dynamic_maximum():
    fixed = Scenario("fixed", 100, [1, 1, 1, 1], seed=0)
    assert np.array_equal(fixed.levels(1), fixed.levels(7))
    assert np.bincount(fixed.levels(1))[1:].tolist() == [25, 25, 25, 25]
    dynamic = Scenario("dynamic", 100, [1, 2, 7], seed=0)
    assert not np.array_equal(dynamic.levels(1), dynamic.levels(2))
    for t in (1, 2, 3):
        assert np.bincount(dynamic.levels(t))[1:].tolist() == [10, 20, 70]
    assert (Scenario("maximum", 10, [1, 1], seed=0).levels(3) == 2).all()
    assert Scenario("fixed", 100, [1, 1], seed=1).budget(5, 1).level in (1, 2)


def test_lr_schedules_by_hand():
    c = Config(lr=0.1, rounds=11)
    assert c.replace(lr_schedule="constant").lr_at(5) == 0.1
    step = c.replace(lr_schedule="step", lr_steps=[3, 6], lr_gamma=0.1)
    assert [round(step.lr_at(t), 6) for t in (1, 3, 4, 6, 7)] == [0.1, 0.1, 0.01, 0.01, 0.001]
    cos = c.replace(lr_schedule="cosine", lr_min=0.01)
    assert cos.lr_at(1) == pytest.approx(0.1) and cos.lr_at(11) == pytest.approx(0.01)
    assert cos.lr_at(6) == pytest.approx(0.01 + 0.5 * 0.09 * (1 + math.cos(math.pi / 2)))
    exp = c.replace(lr_schedule="exponential", lr_gamma=0.998)
    assert exp.lr_at(3) == pytest.approx(0.1 * 0.998 ** 2)


def test_flags_are_coerced_and_checked():
    c = config_from({"proportions": "1,2,7", "levels": "3", "flip": "true", "rounds": "4"}).validate()
    assert c.proportions == [1.0, 2.0, 7.0] and c.levels == 3 and c.flip is True and c.rounds == 4
    with pytest.raises(HetflError, match="rounds must be of type int"):
        config_from({"rounds": "many"})


def test_batches_cover_every_sample_once_and_never_end_with_a_single_sample():
    import torch

    from hetfl.trainers.schedule import batches

    for n in (1, 16, 17, 33, 40):
        parts = batches(n, 16, torch.Generator().manual_seed(0))
        assert sorted(torch.cat(parts).tolist()) == list(range(n))
        assert n == 1 or len(parts[-1]) > 1
