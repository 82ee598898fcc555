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


@contextmanager
def static_batchnorm(model: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> Iterator[nn.Module]:
    """Within the block, BatchNorm layers normalise with statistics recomputed on ``x`` (model in eval mode).

    HeteroFL's static BN (sBN, Diao et al., 2021, Sec. 3.2): BN keeps no running statistics during
    federated training; before inference the statistics are accumulated over the training data
    with a cumulative average (momentum None). Afterwards the layers use batch statistics again.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]
    was_training = model.training
    for m in layers:
        m.track_running_stats, m.momentum = True, None
        m.running_mean = torch.zeros(m.num_features, device=x.device)
        m.running_var = torch.ones(m.num_features, device=x.device)
        m.num_batches_tracked = torch.zeros((), dtype=torch.long, device=x.device)
    try:
        if layers:
            model.train()
            with torch.no_grad():
                for start in range(0, len(x), batch_size):
                    model(x[start:start + batch_size])
        model.eval()
        yield model
    finally:
        for m in layers:
            m.track_running_stats, m.momentum = False, 0.1
            m.running_mean = m.running_var = m.num_batches_tracked = None
        model.train(was_training)
