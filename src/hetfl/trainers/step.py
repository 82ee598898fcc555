"""The client's SGD step as a pure function: parameters, gradients and momentum in, new ones out.

The arithmetic is ``torch.optim.SGD``'s (single-tensor path, the one it takes on the CPU), op for
op, so a client trained through this step gets the weights ``torch.optim.SGD`` gave it, bit for
bit; written out, it also runs under ``torch.func.vmap`` over a stack of clients. In order:

* FedProx (Li et al., 2020, Eq. 2): + mu/2 ||w - w_global||^2  ->  g += mu (w - w_global);
* FedDyn (Acar et al., 2021, Alg. 1): - <g_k, w> + alpha/2 ||w - w_global||^2
  ->  g += alpha (w - w_global) - g_k, with g_k the client's own state (DepthFL Eq. 2);
* clipping: the global L2 norm (``clip_grad_norm_``'s formula), then every element;
* weight decay, momentum (the first step's buffer is the gradient itself), the update.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..task import TrainOptions

Tensors = Sequence[torch.Tensor]


def sgd_update(params: Tensors, grads: Tensors, momenta: Tensors | None, opts: TrainOptions, lr: float,
               anchor: Tensors | None = None, linear: Tensors | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """(new parameters, new momentum buffers) after one step from ``params`` with ``grads`` (``momenta`` None:
    the first step); ``anchor``: the round's global weights (FedProx, FedDyn), ``linear``: FedDyn's g_k."""
    grads = list(grads)
    pull = opts.prox_mu + opts.feddyn_alpha
    if anchor is not None and pull:
        grads = [g.add(p.sub(a), alpha=pull) for g, p, a in zip(grads, params, anchor)]
    if linear is not None:
        grads = [g.sub(h) for g, h in zip(grads, linear)]
    if opts.clip_grad > 0:
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0)
        scale = torch.clamp(opts.clip_grad / (total + 1e-6), max=1.0)
        grads = [g.mul(scale) for g in grads]
    if opts.clip_value > 0:
        grads = [g.clamp(-opts.clip_value, opts.clip_value) for g in grads]
    if opts.weight_decay:
        grads = [g.add(p, alpha=opts.weight_decay) for g, p in zip(grads, params)]
    if opts.momentum:
        momenta = grads if momenta is None else [m.mul(opts.momentum).add(g, alpha=1.0)
                                                 for m, g in zip(momenta, grads)]
        grads = momenta
    return [p.add(g, alpha=-lr) for p, g in zip(params, grads)], momenta
