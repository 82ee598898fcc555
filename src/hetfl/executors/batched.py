"""The batched executor: clients that train the same sub-model the same way train together under ``vmap``.

Clients of one level train one sub-model shape, so a round's jobs fall into groups of equal
(sub-model, recipe, optimizer settings, learning rate). A group's parameters, momentum, FedDyn
anchor and g_k are stacked along a new leading dimension, and the SGD trainer's pure step
(``trainers.sgd.client_step``, the one the sequential executor runs) is ``torch.func.vmap``ped over
it: one launch of each kernel trains many clients, where one client at a time leaves an
accelerator mostly idle (FedJAX and pfl-research batch clients the same way).

Clients of a group may hold different numbers of samples, so their schedules differ in length and
in their last batch. Step s stacks, per batch size, the clients whose schedule has a step s of
that size (a *bucket*): with equal sample counts every step is one bucket of the whole group; with
a skewed partition the full batches still train together and the short last batches in buckets of
their own, while clients whose schedule has ended sit the step out (FedJAX's masked steps; no
sample is ever padded, as BatchNorm uses batch statistics). Where the recipe trains one of several
sub-networks per step (FjORD's sampled width, ``Step.variant``), a bucket also shares the variant:
clients that drew different widths at step s take it in buckets of their own. A bucket smaller than
the group reads and writes its members' rows of the stacked tensors.

Each client's batches and augmentation are drawn up front from its own generator, exactly as when
it trains alone; the whole group's sample positions, bucket members and draws are moved to the
device at once, nothing synchronises inside the steps (ReeFL's best exit is a tensor index), and
the losses are read once per group.

What cannot be stacked trains one client at a time inside this executor, with the sequential
executor's results, and says so once: a trainer that is not batchable (FeDepth's block-wise
training), frozen backbones reading a feature store (looked up by the documents' bytes), and
groups of one client (nothing to stack).

Results equal the sequential executor's up to float rounding (a stacked convolution may sum in
another order; tests/test_executors.py: weights within 1e-4 on short runs) and up to ties: where a
max-pooling window holds equal values (a flat image background), the stacked kernel may pass the
gradient to another of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.func import vmap

from .. import augment
from ..errors import warn
from ..models.frozen_features import is_serving
from ..privacy.clipping import privatized
from ..trainers import TRAINERS
from ..trainers.objectives import step_objectives
from ..trainers.schedule import Step
from ..trainers.sgd import SGDTrainer, client_step
from . import Executor, Job, LocalClients, Reply
from .sequential import SequentialExecutor

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Bucket:
    """The clients of a group that take step ``step`` with batches of one size and one ``variant`` (the sub-network
    the step trains): their rows in the group's stacks, their samples' dataset indices (members, batch) and their
    augmentation draws (None: no augmentation)."""

    step: int
    members: torch.Tensor
    indices: torch.Tensor
    draws: augment.Draws | None
    variant: int = 0


class BatchedExecutor(Executor):
    """Stacks each group of clients training the same sub-model the same way; the rest one at a time."""

    name = "batched"

    def __init__(self, clients: LocalClients):
        self.clients = clients
        self.sequential = SequentialExecutor(clients)
        self.warned: set[str] = set()
        self.group_sizes: list[int] = []  # of the last round, largest first (benchmarks, tests)
        self.bucket_sizes: list[int] = []  # clients per vmapped step in the last round

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """Each job with its client's update, in job order (every group trained before the first reply)."""
        jobs = list(jobs)
        replies: list[Reply | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        for i, job in enumerate(jobs):
            reason = self.unbatchable(job)
            if reason:
                self.say(reason)
                replies[i] = self.sequential.reply(job)
            else:
                groups.setdefault(group_key(job), []).append(i)
        self.group_sizes = sorted((len(g) for g in groups.values()), reverse=True)
        self.bucket_sizes = []
        for members in groups.values():
            if len(members) == 1:  # nothing to stack: the plain step, without vmap's overhead
                replies[members[0]] = self.sequential.reply(jobs[members[0]])
                continue
            for i, reply in zip(members, self.train_group([jobs[i] for i in members])):
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

    def train_group(self, jobs: list[Job]) -> list[Reply]:
        """The replies of a group of clients trained together (same sub-model, recipe, options, learning rate)."""
        trainer: SGDTrainer = TRAINERS["sgd"]
        clients, task = self.clients, jobs[0].task
        models = clients.models
        module = trainer.module(task, jobs[0].local, models)  # frozen tensors are the module's, equal for all
        if clients.x.is_cuda:  # frozen convolutions too: see stack()
            module.to(memory_format=torch.contiguous_format)
        owns = [clients.own(job.client) for job in jobs]
        starts = [trainer.start(module, job.local, job.task, own) for job, own in zip(jobs, owns)]
        sizes = [len(clients.parts[job.client]) for job in jobs]
        schedules = [trainer.schedule(job.task, n) for job, n in zip(jobs, sizes)]
        presents = [trainer.present(job.task, clients.data(job.client)) for job in jobs]  # label masking, or Nones
        present = torch.stack(presents) if presents[0] is not None else None
        params = stack([s.params for s in starts])
        anchor = stack([s.anchor for s in starts]) if starts[0].anchor is not None else None
        linear = stack([s.linear for s in starts]) if starts[0].linear is not None else None
        steps = [client_step(module, o, task.train, task.lr) for o in step_objectives(task.loss, models)]
        out_dims = (0, 0 if task.train.momentum else None, 0, 0)
        momenta: Tensors | None = None
        carry: torch.Tensor | None = None
        total = torch.zeros(len(jobs), device=clients.x.device)
        for bucket in self.buckets(jobs, schedules):
            whole = len(bucket.members) == len(jobs)
            rows = (lambda d, w=whole, m=bucket.members: None if d is None else d if w else  # noqa: E731
                    {n: t.index_select(0, m) for n, t in d.items()})
            x = clients.x[bucket.indices]
            if bucket.draws is not None:
                x = augment.apply(x.flatten(0, 1), bucket.draws).view(x.shape)
            inputs = (rows(params), rows(momenta) if bucket.step else None,
                      None if carry is None or not bucket.step else carry if whole else carry[bucket.members],
                      x, clients.y[bucket.indices], rows(anchor), rows(linear),
                      None if present is None else present if whole else present[bucket.members])
            stepped = vmap(steps[bucket.variant], in_dims=tuple(None if v is None else 0 for v in inputs),
                           out_dims=out_dims)
            new_params, new_momenta, new_carry, loss = stepped(*inputs)
            if whole:
                params, momenta, carry = new_params, new_momenta, new_carry
            else:  # write the bucket's rows back (first step: the group's momenta and carry come into being)
                params = {n: put_rows(params[n], t, bucket.members, len(jobs)) for n, t in new_params.items()}
                if new_momenta is not None:
                    momenta = {n: put_rows(None if momenta is None else momenta[n], t, bucket.members, len(jobs))
                               for n, t in new_momenta.items()}
                carry = put_rows(carry, new_carry, bucket.members, len(jobs))
            total.index_add_(0, bucket.members, loss)
            self.bucket_sizes.append(len(bucket.members))
        losses = [t / max(len(s), 1) for t, s in zip(total.tolist(), schedules)]  # one synchronisation per group
        replies = []
        for g, (job, own, start) in enumerate(zip(jobs, owns, starts)):
            mine = {n: t[g] for n, t in params.items()}
            update, own = trainer.finish(job.task, job.local, start, mine, losses[g], sizes[g], own, models,
                                         presents[g])
            replies.append(Reply(privatized(update, job.local, job.task), keep=clients.keeper(job.client, own)))
        return replies

    def buckets(self, jobs: list[Job], schedules: list[list[Step]]) -> list[Bucket]:
        """Every step's buckets, in step order: the clients with a step of that batch size and variant, their
        samples' dataset indices and draws, built on the host and moved to the device in one copy each."""
        device = self.clients.x.device
        parts = [self.clients.parts[job.client] for job in jobs]
        first = [0]
        for part in parts[:-1]:
            first.append(first[-1] + len(part))
        plan, rows, members, offsets, flips = [], [], [], [], []
        for s in range(max(len(schedule) for schedule in schedules)):
            by_kind: dict[tuple[int, int], list[int]] = {}
            for g, schedule in enumerate(schedules):
                if s < len(schedule):
                    by_kind.setdefault((len(schedule[s].batch), schedule[s].variant), []).append(g)
            for (size, variant), who in by_kind.items():
                plan.append((s, len(who), size, variant))
                members.append(torch.tensor(who))
                for g in who:
                    draws = schedules[g][s].draws
                    rows.append(schedules[g][s].batch + first[g])
                    offsets += [] if draws.offsets is None else [draws.offsets]
                    flips += [] if draws.flips is None else [draws.flips]
        indices = torch.cat(parts)[torch.cat(rows).to(device)].split([n * b for _, n, b, _ in plan])
        members = torch.cat(members).to(device).split([n for _, n, _, _ in plan])
        counts = [n * b for _, n, b, _ in plan]
        offsets = torch.cat(offsets, 1).to(device).split(counts, 1) if offsets else [None] * len(plan)
        flips = torch.cat(flips).to(device).split(counts) if flips else [None] * len(plan)
        padding = jobs[0].task.train.crop_padding
        return [Bucket(s, m, idx.view(n, b), augment.Draws(o, f, padding) if o is not None or f is not None else None,
                       v) for (s, n, b, v), m, idx, o, f in zip(plan, members, indices, offsets, flips)]


def put_rows(stacked: torch.Tensor | None, rows: torch.Tensor, members: torch.Tensor, size: int) -> torch.Tensor:
    """``stacked`` with ``rows`` written in place at ``members`` (a new stack of ``size`` zero rows when None)."""
    if stacked is None:
        stacked = rows.new_zeros((size, *rows.shape[1:]))
    return stacked.index_copy_(0, members, rows)


def group_key(job: Job) -> tuple:
    """What clients trained together must share: the sub-model, its recipe and options, the learning rate and the
    backbone."""
    task = job.task
    return (task.spec, task.loss, task.train, task.lr, task.scaler, task.family, task.trainer)


def stack(dicts: list[Tensors]) -> Tensors:
    """The tensors of ``dicts`` stacked name by name along a new leading dimension, in the default layout: a
    channels-last weight would make vmap's convolutions give channels-last activations, whose copy CUDA's
    batch norm cannot batch ("Tensor.clone(memory_format) inside vmap ... (got ChannelsLast)")."""
    return {n: torch.stack([d[n] for d in dicts]).contiguous() for n in dicts[0]}
