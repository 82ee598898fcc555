"""The client's local loop: SGD with momentum, weight decay and clipping over seeded batches.

Regularisers that pull towards the round's global weights act on the gradient, which is exact
and costs no extra forward pass:

* FedProx (Li et al., 2020, Eq. 2): + mu/2 ||w - w_global||^2  ->  grad += mu (w - w_global).
* FedDyn (Acar et al., 2021, Alg. 1): - <g_k, w> + alpha/2 ||w - w_global||^2
  ->  grad += -g_k + alpha (w - w_global), with g_k the client's own state (DepthFL Eq. 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .augment import augment


@dataclass(frozen=True)
class TrainOptions:
    """Local optimisation settings shared by every client."""

    epochs: int = 1
    batch_size: int = 32
    momentum: float = 0.9
    weight_decay: float = 5e-4
    clip_grad: float = 0.0  # max global L2 norm of the gradient; 0 = no clipping
    clip_value: float = 0.0  # max |element| of the gradient (after the L2 clip, if both); 0 = no clipping
    crop_padding: int = 0
    flip: bool = False
    prox_mu: float = 0.0
    feddyn_alpha: float = 0.0


@dataclass(frozen=True)
class ClientData:
    """A client's samples: the dataset's tensors (shared, on the device) and this client's indices."""

    x: torch.Tensor
    y: torch.Tensor
    indices: torch.Tensor

    def __len__(self) -> int:
        return len(self.indices)


# loss(model, x, y): the method runs the model itself, so a loss may use several forward passes
# (SHeteroFL's smaller widths) or act between blocks (ReeFL).
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def batches(num_samples: int, batch_size: int, generator: torch.Generator, within: bool = False) -> list[torch.Tensor]:
    """A seeded shuffle of range(num_samples) cut into batches (the last one may be smaller).

    A last batch of one sample joins the one before: batch statistics of a single sample are
    undefined where the features are 1x1 (BatchNorm raises). With ``within``, the last two batches
    are instead split in halves, so that no batch exceeds ``batch_size`` (a memory budget measured
    at the batch size then holds for every step).
    """
    parts = list(torch.randperm(num_samples, generator=generator).split(batch_size))
    if len(parts) > 1 and len(parts[-1]) == 1:
        tail = torch.cat(parts[-2:])
        parts[-2:] = list(tail.split((len(tail) + 1) // 2)) if within else [tail]
    return parts


def local_sgd(
    model: nn.Module,
    data: ClientData,
    loss_fn: LossFn,
    opts: TrainOptions,
    lr: float,
    generator: torch.Generator,
    anchor: list[torch.Tensor] | None = None,
    linear_term: list[torch.Tensor] | None = None,
    params: list[nn.Parameter] | None = None,
    within_batch_size: bool = False,
) -> float:
    """Train ``model`` in place for ``opts.epochs`` epochs; returns the mean training loss per batch.

    ``anchor`` (the round's global weights, in parameter order) enables the FedProx and FedDyn
    pulls; ``linear_term`` is FedDyn's g_k in local shape. ``params``: the parameters the optimizer
    moves (default all of ``model``'s; no other parameter changes, not even by momentum or weight
    decay); ``within_batch_size``: no batch exceeds the batch size (``batches``).
    """
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params  # frozen stay put
    optimizer = torch.optim.SGD(params, lr=lr, momentum=opts.momentum, weight_decay=opts.weight_decay)
    model.train()
    pull = opts.prox_mu + opts.feddyn_alpha
    total, steps = torch.zeros((), device=data.x.device), 0
    for _ in range(opts.epochs):
        for batch in batches(len(data), opts.batch_size, generator, within_batch_size):
            idx = data.indices[batch.to(data.indices.device)]
            x = data.x[idx]
            if opts.crop_padding or opts.flip:
                x = augment(x, generator, opts.crop_padding, opts.flip)
            loss = loss_fn(model, x, data.y[idx])
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            with torch.no_grad():
                if anchor is not None and pull:
                    grads = [p.grad for p in params]
                    torch._foreach_add_(grads, torch._foreach_sub(params, anchor), alpha=pull)
                if linear_term is not None:
                    torch._foreach_sub_([p.grad for p in params], linear_term)
            if opts.clip_grad > 0:
                nn.utils.clip_grad_norm_(params, opts.clip_grad)
            if opts.clip_value > 0:
                nn.utils.clip_grad_value_(params, opts.clip_value)
            optimizer.step()
            total += loss.detach()
            steps += 1
    return float(total) / max(steps, 1)
