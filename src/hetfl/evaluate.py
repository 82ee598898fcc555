"""Test accuracy of every exit and of the ensemble (mean of the exit logits, DepthFL Sec. 4)."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .losses import ensemble_logits

INFERENCES = ("last", "ensemble")  # a model's headline prediction: its last exit, or the mean of its exits' logits


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> dict[str, float]:
    """Accuracy of each exit ("exit1".."exitN"), of the ensemble, and the last exit's mean CE ("loss")."""
    return exit_scores(exit_logits(model, x, batch_size), y, batch_size, exit_numbers(model))


def exit_numbers(model: nn.Module) -> tuple[int, ...] | None:
    """The 1-based numbers of the exits ``model`` returns, or None for 1..N."""
    return getattr(model, "exit_numbers", None)


def truncations(states: Mapping[Hashable, Mapping[str, torch.Tensor]],
                numbers: Mapping[Hashable, Sequence[int] | None], candidates: Iterable[Hashable]
                ) -> dict[Hashable, tuple[Hashable, list[int]]]:
    """Which of ``candidates`` are truncations of another model of ``states``: model -> (the largest such other
    model, which is no truncation itself, and the positions of the model's exits among that one's exits).

    A model every tensor of which another holds, equal, with a subset of the other's exits, computes what the
    other computes on the way to those exits (a depth prefix with the same weights, SplitMix's level holding some
    of the global model's bases): the same static BN statistics, since each layer sees the same inputs in the same
    chunks, and the same exit logits. Scoring it from the other's logits is exact and runs nothing twice.
    """
    def within(a, b) -> bool:
        tensors, outer = states[a], states[b]
        if a == b or numbers[a] is None or numbers[b] is None or not set(numbers[a]) <= set(numbers[b]):
            return False
        smaller = (len(tensors), len(numbers[a])) < (len(outer), len(numbers[b]))
        return smaller and all(k in outer and outer[k].shape == t.shape and torch.equal(outer[k], t)
                               for k, t in tensors.items())

    found = {}
    for a in candidates:
        outer = [b for b in states if within(a, b)]
        if outer:
            b = max(outer, key=lambda s: (len(states[s]), len(numbers[s])))
            found[a] = (b, [list(numbers[b]).index(n) for n in numbers[a]])
    return found


@torch.no_grad()
def exit_logits(model: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> list[list[torch.Tensor]]:
    """Per batch of ``batch_size`` samples of ``x``, the logits of every exit ``model`` holds, shallowest first."""
    model.eval()
    return [model(x[start:start + batch_size]) for start in range(0, len(x), batch_size)]


def exit_scores(batches: list[list[torch.Tensor]], y: torch.Tensor, batch_size: int,
                numbers: Sequence[int] | None = None) -> dict[str, float]:
    """``evaluate``'s scores from per-batch exit logits (``exit_logits``): the exits are numbered ``numbers``
    (default 1..N), the ensemble is the mean of their logits, the loss is the last exit's mean CE."""
    tallies = [batch_tally(logits, y[start:start + batch_size])
               for start, logits in zip(range(0, len(y), batch_size), batches)]
    return tally_scores(tallies, len(y), numbers)


def batch_tally(logits: list[torch.Tensor], target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a batch adds to a model's scores: the hits of each exit and of the ensemble, and the last exit's summed
    CE."""
    outputs = logits + [ensemble_logits(logits)]
    hits = torch.stack([(o.argmax(1) == target).sum() for o in outputs])
    return hits, F.cross_entropy(logits[-1], target, reduction="sum")


def tally_scores(tallies: list[tuple[torch.Tensor, torch.Tensor]], n: int, numbers: Sequence[int] | None = None
                 ) -> dict[str, float]:
    """``exit_scores`` of the batches' tallies (``batch_tally``) of ``n`` samples, added in the batches' order (so the
    float sum of the loss does not depend on who computed which batch)."""
    correct: torch.Tensor | None = None
    loss = torch.zeros((), device=tallies[0][1].device)
    for hits, batch_loss in tallies:
        correct = hits if correct is None else correct + hits
        loss += batch_loss.to(loss.device)
    acc = (correct.double() / n).tolist()
    result = {f"exit{k}": a for k, a in zip(numbers or range(1, len(acc)), acc[:-1])}
    result["ensemble"] = acc[-1]
    result["loss"] = float(loss) / n
    return result


STATS_CHUNK = 500  # samples per forward pass of the statistics pass: fixed, so no statistic depends on eval batching


@contextmanager
def static_batchnorm(model: nn.Module, x: torch.Tensor, chunk: int = STATS_CHUNK, team=None) -> Iterator[nn.Module]:
    """Within the block, BatchNorm layers normalise with fixed statistics of ``x`` (model in eval mode).

    HeteroFL's static BN (sBN, Diao et al., 2021, Sec. 3.2): BN keeps no running statistics during
    federated training; before inference they are computed on training data, and inference uses
    them for every sample alone. hetfl applies it to every BatchNorm model, so no accuracy depends
    on how the test set is batched (DESIGN.md, "One evaluation protocol"). The pass runs ``x`` in
    chunks of ``chunk`` samples with BN on batch statistics (as in training, and as sBN's pass
    does), and each layer's statistics are pooled over all of ``x``: the mean and variance that
    BatchNorm computes for each chunk anyway are kept and combined in float64 by the
    parallel-variance formula (Chan et al.), giving the unbiased variance of all of ``x`` as
    PyTorch's running statistics would, rather than PyTorch's cumulative average of per-batch
    variances, which would miss the spread between the batches' means and depend on the batch size.
    Afterwards the layers use batch statistics again.

    ``team`` (``distributed.Team``): the processes of a run share the chunks, each running its own; the
    chunks' moments are gathered in chunk order, so the statistics are one process's, exactly.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]
    was_training = model.training
    moments: dict[nn.Module, list[tuple[int, torch.Tensor, torch.Tensor]]] = {m: [] for m in layers}

    for m in layers:  # an instance attribute, so the layer's hooks still run
        m.forward = functools.partial(_normalise_and_record, m, moments[m])
    try:
        if layers:
            model.train()
            starts = range(0, len(x), chunk)
            with torch.no_grad():
                for k in team.share(len(starts)) if team else range(len(starts)):
                    model(x[starts[k]:starts[k] + chunk])
            if team is not None and team.size > 1:
                every = team.gather([moments[m] for m in layers])
                for j, m in enumerate(layers):
                    moments[m][:] = [(n, mean.to(x.device), var.to(x.device))
                                     for part in every for n, mean, var in part[j]]
        for m in layers:
            del m.forward
            mean, var = _pooled_moments(moments[m])
            m.track_running_stats = True
            m.running_mean, m.running_var = mean.float(), var.float()
            m.num_batches_tracked = torch.zeros((), dtype=torch.long, device=x.device)
        model.eval()
        yield model
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None
        model.train(was_training)


def _normalise_and_record(layer: nn.Module, moments: list, h: torch.Tensor) -> torch.Tensor:
    """BatchNorm on the batch's statistics, as in training, keeping (count, mean, biased variance) of each
    channel: the statistics that ``native_batch_norm`` computes for the normalisation itself (computing
    them again on the side, in float64, took as long as the rest of the pass).

    Their precision is BatchNorm's own: about 1e-7 relative on contiguous tensors, but on a CPU the
    channels-last kernel (which a convolution of a 1-channel image hands on through the whole CNN)
    sums in float32: up to 1e-3 relative in the variance of a CNN's first layer. That is far below
    the sampling error of estimating the statistics from ``static_bn_samples`` images (about 1e-2),
    and against exact float64 statistics it moved at most 2 of 10,000 test predictions of an exit
    (the full-width CNN after one FedAvg round, and a HeteroFL run's four models).
    """
    out, mean, inv_std = torch.native_batch_norm(h, layer.weight, layer.bias, None, None, True, 0.0, layer.eps)
    var = inv_std.double().pow(-2) - layer.eps
    moments.append((h.numel() // h.shape[1], mean.double(), var.clamp_min(0)))
    return out


def _pooled_moments(chunks: list[tuple[int, torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of the union of chunks given as (count, mean, biased variance)."""
    n = sum(count for count, _, _ in chunks)
    mean = sum(count * m for count, m, _ in chunks) / n
    squares = sum(count * (v + (m - mean) ** 2) for count, m, v in chunks)
    return mean, squares / max(n - 1, 1)
