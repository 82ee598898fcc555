"""Local SGD on the whole sub-model (``trainer = sgd``): a pure step over parameters, shared by every executor.

``client_step`` is one step as a function of tensors: the objective's gradient through
``torch.func.functional_call`` and ``torch.func.grad_and_value``, then ``step.sgd_update``. The
sequential executor calls it for one client (``train_steps``); the batched executor ``vmap``s the
same function over a stack of clients. ``start`` and ``finish`` are the parts of a client update
around the steps (the FedProx/FedDyn anchor and FedDyn's g_k; the update and the new own state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from ..losses import client_classes, label_masked
from ..models.cache import ModelCache
from ..recipes import step_variants
from ..seeding import torch_generator
from ..slicing import State, SubModel
from ..task import Task, TrainOptions
from ..updates import Update
from .objectives import Objective, step_objectives
from .schedule import ClientData, Step, draw_schedule, draw_variants, on_device, step_inputs
from .step import sgd_update

Tensors = dict[str, torch.Tensor]
StepFn = Callable[..., tuple[Tensors, Tensors | None, torch.Tensor | None, torch.Tensor]]


def client_step(module: nn.Module, objective: Objective, opts: TrainOptions, lr: float) -> StepFn:
    """``step(params, momenta, carry, x, y, anchor, linear, present=None) -> (params, momenta, carry, loss)``: one SGD
    step of ``module``'s trainable ``params`` (a dict; the module's own frozen tensors stay) on the batch (x, y).

    ``momenta`` and ``carry`` are None before the first step (an objective without a carry passes
    a 0-d tensor along after it); ``anchor`` (the round's global weights) and ``linear`` (FedDyn's
    g_k) are dicts like ``params``, or None when unused; ``present``: the client's classes when the task masks
    labels (``losses.label_masked``: the logits of the others are set to 0), else None.
    """
    def step(params, momenta, carry, x, y, anchor, linear, present=None):
        def loss_of(params):  # the batch and the carry are closed over: only the parameters are differentiated
            def forward(inputs):
                return label_masked(functional_call(module, params, (inputs,)), present)

            loss, out = objective(forward, params, x, y, carry, present=present)
            return loss, loss.new_zeros(()) if out is None else out  # a transform returns tensors only

        grads, (loss, carry) = grad_and_value(loss_of, has_aux=True)(params)
        names = list(params)
        listed = (lambda d: None if d is None else [d[n] for n in names])  # noqa: E731
        new, momenta = sgd_update(listed(params), listed(grads), listed(momenta), opts, lr, listed(anchor),
                                  listed(linear))
        return dict(zip(names, new)), None if momenta is None else dict(zip(names, momenta)), carry, loss.detach()

    return step


def train_steps(steps: list[StepFn], params: Tensors, data: ClientData, schedule: list[Step], anchor: Tensors | None,
                linear: Tensors | None, present: torch.Tensor | None = None) -> tuple[Tensors, float]:
    """(final parameters, mean training loss per step) of one client after ``schedule``; ``steps``: the step
    function of every variant a step may train (``Step.variant``); ``present``: the client's classes when the
    task masks labels, else None."""
    momenta = carry = None
    total = next(iter(params.values())).new_zeros(())
    layout = {n: t.stride() for n, t in params.items()}
    for s in schedule:
        x, y = step_inputs(data, s)
        params, momenta, carry, loss = steps[s.variant](params, momenta, carry, x, y, anchor, linear, present)
        params = {n: _with_strides(t, layout[n]) for n, t in params.items()}
        total += loss
    return params, float(total) / max(len(schedule), 1)  # one synchronisation per client


def _with_strides(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` laid out with ``strides``: an update keeps its parameter's layout as an in-place optimizer does (a
    convolution's kernel choice, and so its rounding, can depend on the strides of a size-1 dimension)."""
    return t if t.stride() == strides else torch.empty_strided(t.shape, strides, dtype=t.dtype,
                                                               device=t.device).copy_(t)


@dataclass(frozen=True)
class Start:
    """What a client's steps start from: its trainable tensors, and the anchor and g_k when the task pulls."""

    params: Tensors
    anchor: Tensors | None
    linear: Tensors | None


class SGDTrainer:
    """``trainer = sgd``: every trainable tensor of the sub-model, for ``epochs`` over the client's data."""

    name = "sgd"
    batchable = True

    def module(self, task: Task, local: State, models: ModelCache) -> nn.Module:
        """The task's sub-model holding ``local``, in training mode."""
        return models.loaded(task.spec, local).train()

    def start(self, module: nn.Module, local: State, task: Task, client_state: State | None) -> Start:
        """The client's starting point: ``local``'s trainable tensors, the anchor of FedProx / FedDyn and FedDyn's
        g_k (the slice of its own state in global shape; zero before its first round)."""
        # in the module's own layout, which an in-place optimizer would have kept; frozen tensors stay put
        params = {n: _with_strides(local[n], p.stride()) for n, p in module.named_parameters() if p.requires_grad}
        opts = task.train
        anchor = params if opts.prox_mu or opts.feddyn_alpha else None
        linear = None
        if opts.feddyn_alpha:
            linear = {n: _window_of(client_state or {}, task.spec, n, t) for n, t in params.items()}
        return Start(params, anchor, linear)

    def schedule(self, task: Task, num_samples: int) -> list[Step]:
        """The client's steps this round, drawn from its generator (seed, "train", round, client): batches and
        augmentation, then each step's variant where the recipe draws one (FjORD's width)."""
        generator = torch_generator(task.seed, "train", task.round, task.client)
        return draw_variants(draw_schedule(num_samples, task.train, generator), step_variants(task.loss), generator)

    def present(self, task: Task, data: ClientData) -> torch.Tensor | None:
        """The classes the client holds samples of (a boolean vector) when the task masks labels, else None."""
        if not task.train.label_mask:
            return None
        return client_classes(data.y[data.indices.to(data.y.device)], task.family.num_classes)

    def finish(self, task: Task, local: State, start: Start, params: Tensors, loss: float, num_samples: int,
               client_state: State | None, models: ModelCache, present: torch.Tensor | None = None
               ) -> tuple[Update, State | None]:
        """The update (every federated tensor: trained ones and, unchanged, the rest; with label masking, the classes
        it trained on) and the new own state."""
        new_local = {n: params[n] if n in params else local[n].clone() for n in models.shapes(task.spec)}
        if start.linear is not None:
            client_state = _feddyn_client_step(client_state or {}, task, start, params)
        classes = None if present is None else tuple(torch.nonzero(present).flatten().tolist())
        return Update(task.client, task.spec, new_local, num_samples, {"train_loss": loss}, classes), client_state

    def update(self, local: State, task: Task, data: ClientData, client_state: State | None, models: ModelCache
               ) -> tuple[Update, State | None]:
        """Train ``local`` as ``task`` says on ``data``; returns the update and the client's new own state."""
        module = self.module(task, local, models)
        start = self.start(module, local, task, client_state)
        steps = [client_step(module, o, task.train, task.lr) for o in step_objectives(task.loss, models)]
        schedule = on_device(self.schedule(task, len(data)), data.x.device)
        present = self.present(task, data)
        params, loss = train_steps(steps, start.params, data, schedule, start.anchor, start.linear, present)
        return self.finish(task, local, start, params, loss, len(data), client_state, models, present)


def _feddyn_client_step(client_state: State, task: Task, start: Start, end: Tensors) -> State:
    """g_k <- g_k - alpha (w_k - w_global) on this client's slice only (Acar et al., Alg. 1; DepthFL Eq. (3))."""
    alpha = task.train.feddyn_alpha
    new_state = dict(client_state)
    for name, g in start.linear.items():
        key = task.spec.global_name(name)
        full = new_state.get(key)
        full = torch.zeros(task.state_shapes[key], device=g.device) if full is None else full.clone()
        full[task.spec.window(name, full.shape, g.shape, full.device)] = g - alpha * (end[name] - start.params[name])
        new_state[key] = full
    return new_state


def _window_of(state: State, spec: SubModel, name: str, like: torch.Tensor) -> torch.Tensor:
    """The window of local tensor ``name`` of ``spec`` in the client's global-shaped ``state`` (``SubModel.window``),
    shaped like ``like``; zeros when the client has none yet."""
    key = spec.global_name(name)
    if key not in state:
        return torch.zeros_like(like)
    full = state[key]
    return full[spec.window(name, full.shape, like.shape, full.device)].to(like.device)
