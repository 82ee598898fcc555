"""Executors: a round's jobs in, each client's reply out, in job order (DESIGN.md, "Performance").

The round loop (``sim.Simulation``) plans the jobs, checks the replies and aggregates them; how the
clients' work gets done is the executor's: ``sequential`` (one client after another, in this
process), ``batched`` (clients that share a sub-model and a step schedule stacked under
``torch.func.vmap``), ``flower`` (every client on a SuperNode: ``flower.deployment``).
``DistributedExecutor`` shares a round among the processes of a run, each with its local executor;
``FaultInjection`` wraps any of them. An executor may also know a client's own budget (a node that
states it), wait for its clients before the first round, and checkpoint state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ..checkpoint import ClientStateStore
from ..devices import Budget
from ..models.cache import ModelCache
from ..slicing import State
from ..task import Task
from ..trainers.schedule import ClientData
from ..updates import Update

@dataclass(frozen=True)
class Job:
    """One client's work in a round: its task and the local tensors cut for it."""

    client: int
    task: Task
    local: State


@dataclass(frozen=True)
class Reply:
    """What a client sent back for a job: an update to check, or why there is none (both None: no reply)."""

    update: Update | None = None
    problem: str | None = None  # it replied, but not with an update (an error, unreadable content)
    # makes the client's new own state (FedDyn's g_k) the one it keeps; called only if the update is aggregated
    keep: Callable[[], None] | None = None
    wire_bytes_down: int = 0  # bytes of the serialised message sent and received (engines with a wire)
    wire_bytes_up: int = 0


@dataclass
class SecureSums:
    """What secure aggregation gives the server for a round instead of the updates: their sums alone.

    ``deltas``: per global name, the sum over the clients of (update - the global tensors it was cut from) in global
    shape, 0 where a client held nothing; ``counts``: per global name, how many of them held each element (uniform
    weights); ``within``: the sum of differential privacy's adaptive-clipping bits (0 without it)."""

    deltas: State
    counts: State
    clients: int  # updates summed
    within: float = 0.0
    train_loss: float | None = None  # the clients' mean training loss, where they report it
    missing: list[int] = field(default_factory=list)  # clients given a task whose update is not in the sums
    wire_bytes_down: int = 0
    wire_bytes_up: int = 0


class Executor:
    """Runs a round's jobs; the hooks have engine-neutral defaults."""

    name = "executor"
    wire = False  # whether replies count the bytes of a serialised form (RoundLog.wire_bytes_*)
    secure = False  # whether the server gets only the sum of a round's updates (``aggregate_securely``)

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """Each job with its client's reply, in job order."""
        raise NotImplementedError

    def aggregate_securely(self, jobs: list[Job], round_index: int) -> SecureSums:
        """The sums of the jobs' updates, the server seeing no single one (executors whose ``secure`` is True)."""
        raise NotImplementedError

    def budget(self, client: int, round_index: int) -> Budget | None:
        """The budget ``client`` states itself, or None (the scenario's applies)."""
        return None

    def prepare(self) -> None:
        """Returns None; called once before the first round this process runs (e.g. wait for the clients)."""

    def state(self) -> dict:
        """What a checkpoint must keep of the executor (plain values)."""
        return {}

    def restore(self, payload: dict) -> None:
        """Returns None; restores ``state`` from a checkpoint's payload."""

    def checkpointed(self) -> None:
        """Returns None; called after every checkpoint."""


@dataclass
class LocalClients:
    """Every client of an in-process engine: the dataset's tensors on the device, each client's indices, the
    reusable sub-model objects, and where each client's own state is kept."""

    x: torch.Tensor
    y: torch.Tensor
    parts: list[torch.Tensor]
    models: ModelCache
    store_of: Callable[[], ClientStateStore] | None = None  # the run's store (its folder exists once the run has)

    @property
    def store(self) -> ClientStateStore | None:
        """Each client's own state on disk, or None when the method keeps none."""
        return self.store_of() if self.store_of else None

    def data(self, client: int) -> ClientData:
        """``client``'s samples."""
        return ClientData(self.x, self.y, self.parts[client])

    def own(self, client: int) -> State | None:
        """``client``'s own persistent state (FedDyn's g_k), None if it has none yet or the method keeps none."""
        store = self.store
        return store.load(client, self.x.device) if store else None

    def keeper(self, client: int, own: State | None) -> Callable[[], None] | None:
        """What keeps ``own`` as ``client``'s state once its update is aggregated (None: nothing to keep)."""
        store = self.store
        if store is None or own is None:
            return None
        return lambda: store.save(client, own)
