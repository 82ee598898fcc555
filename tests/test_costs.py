"""The cost model: counts worked by hand on small layers, and measured memory that behaves."""

import torch
from torch import nn

from hetfl.costs import count_macs, count_params, latencies_ms, measure, saved_activation_bytes
from hetfl.models import ArchSpec, ModelFamily, MultiExitModel, model_family
from hetfl.slicing import SubModel


def tiny_builder(input_shape, num_classes, *, width, depth, norm):
    """Conv2d(1, 2, 3, padding 1) on 1x4x4, then an exit Flatten + Linear(32, 3)."""
    block = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1))
    return MultiExitModel(nn.Identity(), [block], [nn.Sequential(nn.Flatten(), nn.Linear(32, 3))], (0,))


TINY = ModelFamily("tiny", (1, 4, 4), 3, ArchSpec(1, (0,)), tiny_builder)


def test_params_and_macs_by_hand():
    model = TINY.build()
    assert count_params(model) == (1 * 2 * 9 + 2) + (32 * 3 + 3)
    # conv: 4x4 outputs x 2 channels x 9 taps; linear: 32 x 3 (bias adds are not MACs)
    assert count_macs(model, (1, 4, 4)) == 4 * 4 * 2 * 9 + 32 * 3


def test_cost_fields_and_training_memory_formula():
    c = measure(TINY, SubModel(depth=1), batch_size=8)
    assert c.bytes_down == c.bytes_up == 4 * c.params
    assert c.train_memory == c.activation_bytes + 3 * 4 * c.params  # params + grads + momentum
    plain = measure(TINY, SubModel(depth=1), batch_size=8, momentum=False)
    assert plain.train_memory == plain.activation_bytes + 2 * 4 * plain.params


def test_saved_activations_by_hand():
    """Autograd saves the conv input (8x1x4x4 floats) and the linear input (8x32 floats)."""
    model = TINY.build()
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 3, (8,))
    saved = saved_activation_bytes(model, x, y)
    assert saved >= 4 * (8 * 16 + 8 * 32)


def test_memory_grows_with_batch_and_shrinks_with_width():
    fam = model_family("cnn", (1, 28, 28), 10)
    small, big = measure(fam, SubModel(depth=4), 16), measure(fam, SubModel(depth=4), 32)
    assert big.activation_bytes > 1.8 * small.activation_bytes
    narrow = measure(fam, SubModel(depth=4, width=0.5), 32)
    assert narrow.activation_bytes < big.activation_bytes and narrow.train_memory < big.train_memory
    assert narrow.macs < big.macs / 3 and narrow.params < big.params / 3  # about a quarter
    shallow = measure(fam, SubModel(depth=2), 32)
    assert shallow.macs < big.macs and shallow.params < big.params


def test_measure_is_cached():
    fam = model_family("cnn", (1, 8, 8), 10, width=0.25)
    assert measure(fam, SubModel(depth=2), 8) is measure(fam, SubModel(depth=2), 8)


def test_latency_is_a_positive_median_with_a_spread_and_threads_are_restored():
    threads = torch.get_num_threads()
    (median, iqr), = latencies_ms([TINY.build()], (1, 4, 4), seconds=0.01, min_repeats=8)
    assert median > 0 and iqr >= 0
    assert torch.get_num_threads() == threads


class Probe(nn.Module):
    """An identity that records the grad mode, thread count and train flag of every pass."""

    def __init__(self):
        super().__init__()
        self.seen, self.passes = set(), 0

    def forward(self, x):
        self.seen.add((torch.is_grad_enabled(), torch.get_num_threads(), self.training))
        self.passes += 1
        return x


def test_latency_is_one_pair_per_module_in_order_timed_without_autograd_on_one_thread():
    probe, heavy = Probe(), nn.Sequential(nn.Flatten(), nn.Linear(16, 1024), nn.Linear(1024, 1024))
    timed = latencies_ms([probe, heavy, Probe()], (1, 4, 4), seconds=0.02, min_repeats=50)
    assert len(timed) == 3 and timed[1][0] > 10 * timed[0][0]  # ~1M MACs against an identity, in the given order
    assert probe.seen == {(False, 1, False)}  # no autograd, one thread, eval mode
    assert probe.passes >= 50 + 7  # min_repeats timed, after the warm-up (Timer.timeit(5) and its own 2)


def test_latency_times_each_module_in_the_turns_asked_taken_round_robin(monkeypatch):
    from torch.utils.benchmark import Timer

    order, autorange = [], Timer.blocked_autorange

    def recorded(timer, *args, **kwargs):
        order.append(timer._task_spec.description)
        return autorange(timer, *args, **kwargs)

    monkeypatch.setattr(Timer, "blocked_autorange", recorded)
    latencies_ms([Probe(), Probe()], (1, 4, 4), seconds=0.02, min_repeats=1, turns=7)
    assert order == ["module 0", "module 1"] * 7


def test_costs_command(capsys):
    from hetfl.cli import main

    assert main(["costs", "cnn", "--method", "depthfl", "--no-latency"]) == 0
    out = capsys.readouterr().out
    assert "level 4" in out and "1,561,384" in out
    assert main(["costs", "nope"]) == 2
