"""The batched executor: clients that share a sub-model and a step schedule train together under ``vmap``.

Clients of one level train one sub-model shape, so a round's jobs fall into groups of equal
(sub-model, recipe, optimizer settings, learning rate, step schedule: number of steps and batch
sizes). A group's parameters, momentum, FedDyn anchor and g_k and batches are stacked along a new
leading dimension, and the SGD trainer's pure step (``trainers.sgd.client_step``, the one the
sequential executor runs) is ``torch.func.vmap``ped over it: one kernel launch trains the whole
group, where one client at a time leaves an accelerator mostly idle (FedJAX and pfl-research batch
clients the same way). Each client's batches and augmentation are drawn up front from its own
generator, exactly as when it trains alone, and moved to the device once per group; nothing
synchronises inside a group's steps (ReeFL's best exit is a tensor index), and the losses are read
once per group. Clients whose schedules differ go to different groups; samples are never padded
(BatchNorm uses batch statistics).

What cannot be stacked trains one client at a time inside this executor, with the same results as
the sequential executor, and says so once: a trainer that is not batchable (FeDepth's block-wise
training), frozen backbones reading a feature store (looked up by the documents' bytes), and
groups of one client (nothing to stack).

Results equal the sequential executor's up to float rounding: a stacked convolution may sum in
another order (tests/test_executors.py checks weights within 1e-4 on short runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.func import vmap

from .. import augment
from ..errors import warn
from ..models.frozen_features import is_serving
from ..trainers import TRAINERS
from ..trainers.objectives import objective_for
from ..trainers.schedule import Step
from ..trainers.sgd import SGDTrainer, client_step
from . import Executor, Job, LocalClients, Reply
from .sequential import SequentialExecutor


class BatchedExecutor(Executor):
    """Stacks each group of same-shaped clients and trains it with one vmapped step; the rest one at a time."""

    name = "batched"

    def __init__(self, clients: LocalClients):
        self.clients = clients
        self.sequential = SequentialExecutor(clients)
        self.warned: set[str] = set()
        self.group_sizes: list[int] = []  # of the last round, for benchmarks

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """Each job with its client's update, in job order (every group trained before the first reply)."""
        jobs = list(jobs)
        replies: list[Reply | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        schedules: dict[int, list[Step]] = {}
        for i, job in enumerate(jobs):
            reason = self.unbatchable(job)
            if reason:
                self.say(reason)
                replies[i] = self.sequential.reply(job)
                continue
            schedules[i] = TRAINERS["sgd"].schedule(job.task, len(self.clients.parts[job.client]))
            groups.setdefault(group_key(job, schedules[i]), []).append(i)
        self.group_sizes = sorted((len(g) for g in groups.values()), reverse=True)
        for members in groups.values():
            if len(members) == 1:  # nothing to stack: the plain step, without vmap's overhead
                replies[members[0]] = self.sequential.reply(jobs[members[0]])
                continue
            for i, reply in zip(members, self.train_group([jobs[i] for i in members], [schedules[i] for i in members])):
                replies[i] = reply
        yield from zip(jobs, replies)

    def unbatchable(self, job: Job) -> str | None:
        """Why ``job`` cannot be stacked with others, or None."""
        trainer = TRAINERS[job.task.trainer]
        if not trainer.batchable:
            return f"the '{trainer.name}' trainer is not batchable"
        if is_serving():
            return "frozen backbones read a feature store (cache_frozen_features), looked up per document"
        return None

    def say(self, reason: str) -> None:
        """Returns None; warns once per reason that some clients train one at a time."""
        if reason not in self.warned:
            self.warned.add(reason)
            warn(f"batched executor: {reason}; those clients train one at a time")

    def train_group(self, jobs: list[Job], schedules: list[list[Step]]) -> list[Reply]:
        """The replies of a group of clients trained together (same sub-model, recipe, options and schedule)."""
        trainer: SGDTrainer = TRAINERS["sgd"]
        clients, task = self.clients, jobs[0].task
        models = clients.models
        module = trainer.module(task, jobs[0].local, models)  # frozen tensors are the module's, equal for all
        owns = [clients.own(job.client) for job in jobs]
        starts = [trainer.start(module, job.local, job.task, own) for job, own in zip(jobs, owns)]
        params = stack([s.params for s in starts])
        anchor = stack([s.anchor for s in starts]) if starts[0].anchor is not None else None
        linear = stack([s.linear for s in starts]) if starts[0].linear is not None else None
        step = client_step(module, objective_for(task.loss, models), task.train, task.lr)
        out_dims = (0, 0 if task.train.momentum else None, 0, 0)
        momenta = carry = None
        total = torch.zeros(len(jobs), device=clients.x.device)
        for x, y in self.batches(jobs, schedules):
            stacked = vmap(step, in_dims=(0, axis(momenta), axis(carry), 0, 0, axis(anchor), axis(linear)),
                           out_dims=out_dims)
            params, momenta, carry, loss = stacked(params, momenta, carry, x, y, anchor, linear)
            total += loss
        steps = max(len(schedules[0]), 1)
        losses = [t / steps for t in total.tolist()]  # one synchronisation per group
        replies = []
        for g, (job, own, start) in enumerate(zip(jobs, owns, starts)):
            mine = {n: t[g] for n, t in params.items()}
            update, own = trainer.finish(job.task, job.local, start, mine, losses[g], len(clients.parts[job.client]),
                                         own, models)
            replies.append(Reply(update, keep=clients.keeper(job.client, own)))
        return replies

    def batches(self, jobs: list[Job], schedules: list[list[Step]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every step's stacked (augmented) samples (G, B, ...) and labels (G, B): the positions of all steps moved
        to the device at once, then gathered there."""
        x, y, device = self.clients.x, self.clients.y, self.clients.x.device
        parts = [self.clients.parts[job.client] for job in jobs]
        for s in range(len(schedules[0])):
            steps = [schedule[s] for schedule in schedules]
            idx = torch.stack([part[st.batch.to(part.device)] for part, st in zip(parts, steps)])
            samples = x[idx.to(device)]
            draws = steps[0].draws
            if draws.offsets is not None or draws.flips is not None:
                samples = augment_stacked(samples, steps)
            yield samples, y[idx.to(device)]


def augment_stacked(samples: torch.Tensor, steps: list[Step]) -> torch.Tensor:
    """``samples`` (G, B, C, H, W) augmented with each client's own draws (the same numbers as alone)."""
    first = steps[0].draws
    offsets = torch.cat([st.draws.offsets for st in steps], dim=1) if first.offsets is not None else None
    flips = torch.cat([st.draws.flips for st in steps]) if first.flips is not None else None
    flat = augment.apply(samples.flatten(0, 1), augment.Draws(offsets, flips, first.padding))
    return flat.view(samples.shape)


def group_key(job: Job, schedule: list[Step]) -> tuple:
    """What clients trained together must share: the sub-model, its recipe and options, the learning rate, the
    backbone, and the step schedule's batch sizes."""
    task = job.task
    return (task.spec, task.loss, task.train, task.lr, task.scaler, task.family, task.trainer,
            tuple(len(step.batch) for step in schedule))


def stack(dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors of ``dicts`` stacked name by name along a new leading dimension."""
    return {n: torch.stack([d[n] for d in dicts]) for n in dicts[0]}


def axis(value) -> int | None:
    """vmap's in_dim of an optional stacked argument."""
    return None if value is None else 0
