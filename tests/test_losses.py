"""ScaleFL Eq. (5) checked by hand: exit weights, temperature, and the detached teacher."""

import pytest
import torch
import torch.nn.functional as F

from hetfl.losses import exits_ce, weighted_exits_with_last_teacher


def test_eq5_value_two_exits_by_hand():
    z1, z2 = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 1.0, 0.5]])
    y = torch.tensor([1])
    beta, tau = 0.1, 3.0
    pt, ps = (z2 / tau).softmax(1), (z1 / tau).softmax(1)
    kl = float((pt * (pt.log() - ps.log())).sum())
    ce1, ce2 = F.cross_entropy(z1, y).item(), F.cross_entropy(z2, y).item()
    expected = (1 * (ce1 + beta * tau**2 * kl) + 2 * ce2) / 3
    assert weighted_exits_with_last_teacher([z1, z2], y, beta, tau).item() == pytest.approx(expected, rel=1e-6)


def test_eq5_single_exit_is_plain_ce_and_beta_zero_is_weighted_ce():
    z = [torch.randn(4, 5) for _ in range(3)]
    y = torch.randint(0, 5, (4,))
    assert torch.allclose(weighted_exits_with_last_teacher(z[:1], y, 0.1, 3.0), exits_ce(z[:1], y))
    weighted = sum((i + 1) * F.cross_entropy(zi, y) for i, zi in enumerate(z)) / 6
    assert torch.allclose(weighted_exits_with_last_teacher(z, y, 0.0, 3.0), weighted)


def test_eq5_last_normaliser_gives_the_last_exit_weight_one():
    """The control normaliser divides by n: the weights become i / n, the last exit's CE at weight 1."""
    z = [torch.randn(4, 5) for _ in range(3)]
    y = torch.randint(0, 5, (4,))
    weighted = sum((i + 1) / 3 * F.cross_entropy(zi, y) for i, zi in enumerate(z))
    assert torch.allclose(weighted_exits_with_last_teacher(z, y, 0.0, 3.0, normaliser="last"), weighted)
    assert torch.allclose(weighted_exits_with_last_teacher(z, y, 0.1, 3.0, normaliser="last"),
                          2 * weighted_exits_with_last_teacher(z, y, 0.1, 3.0))  # sum_i i / n = 2 for n = 3


def test_eq5_teacher_is_detached():
    """The last exit's gradient comes from its own CE only (weight n / sum i), never from the KL terms."""
    z = [torch.randn(2, 4, requires_grad=True) for _ in range(3)]
    y = torch.tensor([0, 3])
    weighted_exits_with_last_teacher(z, y, beta=0.5, tau=2.0).backward()
    last = z[-1].detach().requires_grad_(True)
    (3 / 6 * F.cross_entropy(last, y)).backward()
    assert torch.allclose(z[-1].grad, last.grad, atol=1e-7)
