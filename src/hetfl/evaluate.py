"""Test accuracy of every exit and of the ensemble (mean of the exit logits, DepthFL Sec. 4)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .losses import ensemble_logits

INFERENCES = ("last", "ensemble")  # a model's headline prediction: its last exit, or the mean of its exits' logits


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> dict[str, float]:
    """Accuracy of each exit ("exit1".."exitN"), of the ensemble, and the last exit's mean CE ("loss")."""
    model.eval()
    correct: torch.Tensor | None = None
    loss = torch.zeros((), device=x.device)
    for start in range(0, len(y), batch_size):
        target = y[start:start + batch_size]
        logits = model(x[start:start + batch_size])
        outputs = logits + [ensemble_logits(logits)]
        hits = torch.stack([(o.argmax(1) == target).sum() for o in outputs])
        correct = hits if correct is None else correct + hits
        loss += F.cross_entropy(logits[-1], target, reduction="sum")
    n = len(y)
    acc = (correct.double() / n).tolist()
    numbers = getattr(model, "exit_numbers", range(1, len(acc)))
    result = {f"exit{n}": a for n, a in zip(numbers, acc[:-1])}
    result["ensemble"] = acc[-1]
    result["loss"] = float(loss) / n
    return result


STATS_CHUNK = 500  # samples per forward pass of the statistics pass: fixed, so no statistic depends on eval batching


@contextmanager
def static_batchnorm(model: nn.Module, x: torch.Tensor, chunk: int = STATS_CHUNK) -> Iterator[nn.Module]:
    """Within the block, BatchNorm layers normalise with fixed statistics of ``x`` (model in eval mode).

    HeteroFL's static BN (sBN, Diao et al., 2021, Sec. 3.2): BN keeps no running statistics during
    federated training; before inference they are computed on training data, and inference uses
    them for every sample alone. hetfl applies it to every BatchNorm model, so no accuracy depends
    on how the test set is batched (DESIGN.md, "One evaluation protocol"). The pass runs ``x`` in
    chunks of ``chunk`` samples with BN on batch statistics (as in training, and as sBN's pass
    does), and each layer's statistics are pooled exactly over all of ``x`` (sums of x and x^2 in
    float64; the unbiased variance, as PyTorch's running statistics), rather than PyTorch's
    cumulative average of per-batch variances, which would miss the spread between the batches'
    means and depend on the batch size. Afterwards the layers use batch statistics again.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]
    was_training = model.training
    sums: dict[nn.Module, list] = {m: [0.0, 0.0, 0] for m in layers}

    def accumulate(layer, inputs):
        h = inputs[0].detach().double()
        dims = [d for d in range(h.dim()) if d != 1]  # every axis but the channels
        acc = sums[layer]
        acc[0] = acc[0] + h.sum(dims)
        acc[1] = acc[1] + (h * h).sum(dims)
        acc[2] += h.numel() // h.shape[1]

    hooks = [m.register_forward_pre_hook(accumulate) for m in layers]
    try:
        if layers:
            model.train()
            with torch.no_grad():
                for start in range(0, len(x), chunk):
                    model(x[start:start + chunk])
        for h in hooks:
            h.remove()
        for m in layers:
            total, squares, n = sums[m]
            mean = total / n
            var = (squares / n - mean * mean).clamp_min(0) * (n / max(n - 1, 1))
            m.track_running_stats = True
            m.running_mean, m.running_var = mean.float(), var.float()
            m.num_batches_tracked = torch.zeros((), dtype=torch.long, device=x.device)
        model.eval()
        yield model
    finally:
        for h in hooks:
            h.remove()
        for m in layers:
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None
        model.train(was_training)
