"""The distributed executor: a round's jobs shared among the ranks of a run, every reply on every rank in job order.

Every rank draws the same jobs (the round loop is replicated, ``distributed``). They are shared by
longest-processing-time-first: each job, most costly first, goes to the rank with the least work
so far, where a job costs its client's samples x epochs x its sub-model's MACs per sample, scaled by
the seconds per MAC-sample measured for that sub-model in earlier rounds (by the estimate alone
before). The assignment moves no result: a client's update depends only on its job. Each rank
trains its share with its local executor (sequential or batched), the replies are gathered, and
every rank yields all of them in job order, so the round loop's checks, aggregation and server
state are those of one process with the same local executor (bit-identical for the sequential one).

Clients' own state (FedDyn's g_k) lives in rank 0's run folder only: rank 0 sends each rank the
state of the clients it trains this round, and the new state comes back with the reply; rank 0
keeps it when the round loop accepts the update.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from ..costs import measure
from ..distributed import Team
from ..slicing import State
from ..updates import Update
from . import Executor, Job, LocalClients, Reply


class MemoryStore:
    """A rank's stand-in for the client state store: the states rank 0 sent this round; ``save`` keeps the new ones
    to send back."""

    def __init__(self):
        self.states: dict[int, State] = {}

    def load(self, client: int, device) -> State | None:
        state = self.states.get(client)
        return None if state is None else {k: v.to(device) for k, v in state.items()}

    def save(self, client: int, state: State) -> None:
        self.states[client] = state


class DistributedExecutor(Executor):
    """``inner`` (a local executor over ``clients``) on this rank's share of each round's jobs; on rank 0
    ``clients.store`` is the run's client state store, elsewhere a ``MemoryStore``."""

    def __init__(self, inner: Executor, clients: LocalClients, team: Team, family):
        self.inner, self.clients, self.team, self.family = inner, clients, team, family
        self.name = inner.name
        self.pace: dict = {}  # sub-model -> measured seconds per (sample x epoch x MAC)
        self.shares: list[float] = []  # each rank's estimated work in the last round (tests, bench scaling)

    def cost(self, job: Job) -> float:
        """The job's estimated work (``work``), in measured seconds where its sub-model's pace is known."""
        known = list(self.pace.values())
        return self.work(job) * self.pace.get(job.task.spec, sum(known) / len(known) if known else 1.0)

    def work(self, job: Job) -> float:
        """Samples x epochs x MACs per sample of the job's sub-model (measured once per sub-model and process)."""
        macs = max(measure(self.family, job.task.spec).macs, 1)
        return float(len(self.clients.parts[job.client]) * job.task.train.epochs * macs)

    def assign(self, jobs: list[Job]) -> list[int]:
        """The rank that trains each job: longest processing time first onto the least-loaded rank (ties: the lower
        job position, the lower rank), the same on every rank."""
        costs = [self.cost(job) for job in jobs]
        load = [0.0] * self.team.size
        owner = [0] * len(jobs)
        for i in sorted(range(len(jobs)), key=lambda i: (-costs[i], i)):
            rank = min(range(self.team.size), key=lambda r: (load[r], r))
            owner[i] = rank
            load[rank] += costs[i]
        self.shares = load
        return owner

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """Each job with its client's reply, in job order, on every rank."""
        jobs, team, store = list(jobs), self.team, self.clients.store
        owner = self.assign(jobs)
        mine = [i for i, r in enumerate(owner) if r == team.rank]
        if store is not None:  # the clients' own state goes where they train
            sent = None
            if team.owner:
                sent = [{} if r == 0 else {jobs[i].client: store.load(jobs[i].client) for i in range(len(jobs))
                                           if owner[i] == r} for r in range(team.size)]
            states = team.scatter(sent)
            if not team.owner:
                store.states = {c: s for c, s in states.items() if s is not None}
        local, measured = {}, []
        started = time.perf_counter()
        # the local executors reply in job order; a batched one replies to a group at once (its first job bears its
        # time)
        for i, (_, reply) in zip(mine, self.inner.execute((jobs[i] for i in mine), round_index)):
            local[i] = reply
            finished = time.perf_counter()
            measured.append((i, finished - started))
            started = finished
        sent_back = {i: _portable(reply, jobs[i].client, store, team.owner) for i, reply in local.items()}
        everyone = team.gather((sent_back, measured))
        self._learn_pace(jobs, [m for _, ms in everyone for m in ms])
        replies: dict[int, Reply] = {}
        for rank, (theirs, _) in enumerate(everyone):
            for i, portable in theirs.items():
                replies[i] = local[i] if rank == team.rank and team.owner else \
                    _arrived(portable, jobs[i].client, store if team.owner else None, self.clients.x.device)
        for i, job in enumerate(jobs):
            yield job, replies[i]

    def _learn_pace(self, jobs: list[Job], measured: list[tuple[int, float]]) -> None:
        """Keeps each sub-model's seconds per (sample x epoch x MAC) measured this round (every rank the same)."""
        per_spec: dict = {}
        for i, seconds in measured:
            per_spec.setdefault(jobs[i].task.spec, []).append(seconds / self.work(jobs[i]))
        for spec, paces in per_spec.items():
            self.pace[spec] = sum(paces) / len(paces)


def _portable(reply: Reply, client: int, store, owner: bool) -> tuple[Update | None, str | None, State | None]:
    """What a reply sends to the other ranks: its update, its problem, and the client's new own state (captured
    here by running ``keep`` into this rank's ``MemoryStore``; rank 0's own replies keep theirs themselves)."""
    own = None
    if reply.keep is not None and not owner:
        reply.keep()
        own = store.states.pop(client, None)
    return reply.update, reply.problem, own


def _arrived(portable, client: int, store, device) -> Reply:
    """A reply gathered from another rank, its tensors on this rank's device; on rank 0, ``keep`` stores the
    client's new own state."""
    update, problem, own = portable
    if update is not None:
        update.state = {k: v.to(device) for k, v in update.state.items()}
    keep = (lambda: store.save(client, own)) if store is not None and own is not None else None
    return Reply(update, problem, keep)
