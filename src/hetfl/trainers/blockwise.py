"""FeDepth's depth-wise sequential training (Zhang et al., 2023, Sec. 4, Alg. 1 lines 9-15): the client side
of ``trainer = blockwise``.

The server decomposes the body into consecutive block groups from the client's measured memory
budget (``methods.fedepth``) and sends them in the task (``task.Blockwise``); the client trains
them one after another, each solving problem (1):

* Group j starts from (theta_j of the received global model, the head phi as group j-1 left it)
  and trains its blocks and the head. The blocks before it are frozen: they run without autograd
  (they keep no activation) and are not given to the optimizer, so neither momentum nor weight
  decay moves them (they stay bit-identical; the authors' code lets them drift). The blocks after
  it are not run. The stem trains with block 0 (the authors' {stem, block 1}).
* A group reaches the classifier through the parameter-free skip connection of Fig. 4
  (``skip_connection``: strided subsampling to the head's resolution, channels zero-padded
  symmetrically to the head's width, as the authors' code pads) and the model's own head; or,
  with ``head = aux``, through the auxiliary classifier that follows the group's last block.
* A block in no group (partial training, Sec. "Handle extreme memory constraints") is never
  trained; it runs frozen where a later group needs its output and is not uploaded.
* Local steps: Sec. 4 sizes the work of the J subproblems as that of "the same number of local
  updates" on the whole model, i.e. every subproblem runs the full local budget (``epochs`` over
  the client's data), as the authors' code does; each group has its own SGD optimizer, so its
  momentum starts at zero (a new subproblem).
* m-FeDepth: M models train the same group together on the same batches with deep mutual
  learning (``losses.deep_mutual_learning`` on the groups' logits); the first model is uploaded.
* Buffering (Sec. 4: "when the memory budget permits, the activation ... could be buffered"): the
  frozen prefix's output for every local sample is computed once per group, in chunks of the
  batch size (so the prefix's BatchNorm statistics are those of the chunks rather than of each
  training batch), when the group's planned step plus the buffer fits the budget.

Every step's memory is measured on its own tensors (``memory``): the activations the group and
the head path save for backward, 3 x the trainable parameters (values, gradients, momentum) and
the buffer if any; ``train_blockwise`` returns the largest.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..losses import deep_mutual_learning
from ..memory import SavedTensors, parameter_bytes, step_bytes
from ..models import MultiExitModel
from ..models.cache import ModelCache, build_model
from ..seeding import torch_generator
from ..slicing import State
from ..task import Blockwise, Task, TrainOptions
from ..updates import Update
from .schedule import ClientData, draw_schedule, step_inputs
from .step import sgd_update

Group = tuple[int, int]  # (first, last) blocks, 0-based, inclusive


def skip_connection(h: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``h`` brought to the per-sample ``shape`` (C, H, W) of the head's input without parameters: every s-th
    position per spatial axis (s = ceil(size / target size), the stride of the blocks skipped) and C - C_h zero
    channels, half before and half after (Fig. 4). Unchanged when the shapes already agree (e.g. tokens)."""
    if tuple(h.shape[1:]) == tuple(shape):
        return h
    if h.dim() != 4 or len(shape) != 3 or h.shape[1] > shape[0]:
        raise ValueError(f"no parameter-free skip from features {tuple(h.shape[1:])} to the head's {tuple(shape)}")
    h = h[:, :, ::math.ceil(h.shape[2] / shape[1]), ::math.ceil(h.shape[3] / shape[2])]
    missing = shape[0] - h.shape[1]
    return F.pad(h, (0, 0, 0, 0, missing // 2, missing - missing // 2))


def head_of(model: MultiExitModel, last: int, aux: bool) -> nn.Module:
    """The classifier a group ending at block ``last`` trains: the exit after that block (aux), or the head."""
    return model.exits[model.exit_after.index(last if aux else len(model.blocks) - 1)]


def group_parameters(model: MultiExitModel, group: Group, aux: bool) -> list[nn.Parameter]:
    """The parameters training ``group`` moves: the stem (with block 0), its blocks and its classifier."""
    first, last = group
    parts = ([model.stem] if first == 0 else []) + list(model.blocks[first:last + 1]) + [head_of(model, last, aux)]
    return [p for part in parts for p in part.parameters()]


def frozen_prefix(model: MultiExitModel, x: torch.Tensor, first: int) -> torch.Tensor:
    """The input of block ``first``: the stem and the blocks before it, run without autograd (nothing is kept)."""
    with torch.no_grad():
        h = model.stem(x)
        for block in model.blocks[:first]:
            h = block(h)
    return h


def group_logits(model: MultiExitModel, group: Group, z: torch.Tensor, aux: bool,
                 head_shape: tuple[int, ...]) -> torch.Tensor:
    """The logits of training ``group`` on ``z``: the images when it starts at block 0 (the stem trains with it),
    else the frozen prefix's output; through the skip connection to the head, or the auxiliary classifier."""
    first, last = group
    h = model.stem(z) if first == 0 else z
    for block in model.blocks[first:last + 1]:
        h = block(h)
    return head_of(model, last, aux)(h if aux else skip_connection(h, head_shape))


def group_step(models: list[MultiExitModel], group: Group, inputs: list[torch.Tensor], y: torch.Tensor, aux: bool,
               head_shape: tuple[int, ...], params: list[nn.Parameter]) -> tuple[torch.Tensor, int]:
    """(loss, saved bytes) of one step of ``group`` on every model's input: the loss (CE, or deep mutual learning
    among the models) and the bytes autograd saved for its backward pass (``params`` left out)."""
    with SavedTensors(exclude=params) as saved:
        loss = deep_mutual_learning([group_logits(m, group, z, aux, head_shape) for m, z in zip(models, inputs)], y)
    return loss, saved.bytes


def feature_shapes(model: MultiExitModel, x: torch.Tensor) -> list[tuple[int, ...]]:
    """Per-sample shapes of the stem's output and of every block's output (a forward pass without autograd)."""
    shapes = []
    with torch.no_grad():
        h = model.stem(x)
        shapes.append(tuple(h.shape[1:]))
        for block in model.blocks:
            h = block(h)
            shapes.append(tuple(h.shape[1:]))
    return shapes


def train_blockwise(models: list[MultiExitModel], plan: Blockwise, data: ClientData, opts: TrainOptions, lr: float,
                    generator: torch.Generator) -> tuple[float, int]:
    """Train ``plan``'s groups one after another, in place; returns the mean training loss per step and the
    largest step's measured memory in bytes."""
    if opts.feddyn_alpha:
        raise ValueError("the blockwise trainer has no FedDyn term; train it with FedAvg or FedProx")
    if plan.buffer and (opts.crop_padding or opts.flip):
        raise ValueError("a buffered prefix cannot be augmented; turn buffering or augmentation off")
    aux = plan.head == "aux"
    for model in models:
        model.train()
    shapes = feature_shapes(models[0], data.x[data.indices[:2]])
    start = {p: p.detach().clone() for m in models for p in m.parameters()} if opts.prox_mu else None
    losses, peak = [], 0
    for j, group in enumerate(plan.groups):
        params = [p for m in models for p in group_parameters(m, group, aux)]
        trainable = parameter_bytes(params)
        source, buffered = data, 0
        sample_bytes = len(models) * math.prod(shapes[group[0]]) * params[0].element_size()
        if plan.buffer and group[0] > 0 and plan.group_bytes[j] + len(data) * sample_bytes <= plan.budget_bytes:
            source = _buffered(models, data, group[0], opts.batch_size)
            buffered = source.x.numel() * source.x.element_size()

        def step_loss(x, y):
            nonlocal peak
            inputs = ([x[:, m] for m in range(len(models))] if buffered else
                      [x if group[0] == 0 else frozen_prefix(m, x, group[0]) for m in models])
            loss, saved = group_step(models, group, inputs, y, aux, shapes[-1], params)
            peak = max(peak, step_bytes(saved, trainable) + buffered)
            return loss

        anchor = [start[p] for p in params] if start is not None else None
        losses.append(_train_group(params, step_loss, source, opts, lr, generator, anchor))
    return sum(losses) / max(len(losses), 1), peak


def _buffered(models: list[MultiExitModel], data: ClientData, first: int, chunk: int) -> ClientData:
    """The client's samples as the frozen prefix's outputs of every model, (n, M, *features), computed in chunks."""
    x = data.x[data.indices]
    z = torch.cat([torch.stack([frozen_prefix(m, x[i:i + chunk], first) for m in models], 1)
                   for i in range(0, len(x), chunk)])
    return ClientData(z, data.y[data.indices], torch.arange(len(x), device=data.indices.device))


def trained_prefixes(model: MultiExitModel, plan: Blockwise) -> tuple[str, ...]:
    """Name prefixes of the tensors ``plan`` trains (what a client uploads): the stem if block 0 is trained, the
    blocks of its groups and the classifiers they train."""
    aux = plan.head == "aux"
    names = {id(m): n for n, m in model.named_modules()}
    prefixes = ["stem."] if any(first == 0 for first, _ in plan.groups) else []
    for first, last in plan.groups:
        prefixes += [f"blocks.{b}." for b in range(first, last + 1)] + [names[id(head_of(model, last, aux))] + "."]
    return tuple(dict.fromkeys(prefixes))


def _train_group(params: list[nn.Parameter], step_loss, data: ClientData, opts: TrainOptions, lr: float,
                 generator: torch.Generator, anchor: list[torch.Tensor] | None) -> float:
    """Train ``params`` in place on ``step_loss(x, y)`` over ``opts.epochs`` epochs of ``data`` with the shared SGD
    step (a new subproblem: momentum starts at zero); returns the mean loss per step. No batch exceeds the batch
    size, so the memory measured at the batch size holds for every step."""
    schedule = draw_schedule(len(data), opts, generator, within_batch_size=True)
    momenta, total = None, torch.zeros((), device=data.x.device)
    for step in schedule:
        loss = step_loss(*step_inputs(data, step))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            new, momenta = sgd_update([p.detach() for p in params], grads, momenta, opts, lr, anchor)
            for p, value in zip(params, new):
                p.copy_(value)
        total += loss.detach()
    return float(total) / max(len(schedule), 1)


class BlockwiseTrainer:
    """``trainer = blockwise``: FeDepth's block groups one after another (not batchable: every client's groups
    follow its own memory budget, and each step measures its own memory)."""

    name = "blockwise"
    batchable = False

    def update(self, local: State, task: Task, data: ClientData, client_state: State | None, models: ModelCache
               ) -> tuple[Update, State | None]:
        """FeDepth's client update; returns the update of the tensors it trained and its own state.

        m-FeDepth's other M - 1 models live in the client's own state between rounds, under ``peer{m}/``
        + the global name: a client keeps them across the rounds it takes part in, and starts one from
        the received global model the first time it has the memory for it (a peer started as a copy
        only departs from the uploaded model from the client's next round on: within a round the two
        see the same batches). A client that trains fewer models this round keeps its peers untouched.
        """
        plan = task.blockwise
        model = models.loaded(task.spec, local)
        peers = []
        for m in range(1, plan.models):
            peer = build_model(models.family, task.spec).to(data.x.device)
            key = f"peer{m}/"
            peer.load_state_dict({n: (client_state or {}).get(key + n, t) for n, t in local.items()}, strict=True)
            peers.append(peer)
        generator = torch_generator(task.seed, "train", task.round, task.client)
        loss, peak = train_blockwise([model, *peers], plan, data, task.train, task.lr, generator)
        trained = trained_prefixes(model, plan)
        new_local = {n: t.detach().clone() for n, t in model.state_dict().items() if n.startswith(trained)}
        if peers:
            client_state = dict(client_state or {})
            client_state.update({f"peer{m}/{n}": t.detach().clone()
                                 for m, peer in enumerate(peers, start=1) for n, t in peer.state_dict().items()})
        metrics = {"train_loss": loss, "memory_bytes": peak, "memory_budget": plan.budget_bytes}
        return Update(task.client, task.spec, new_local, len(data), metrics), client_state
