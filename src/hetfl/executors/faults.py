"""Fault injection around any executor: seeded clients that send nothing, and seeded corrupted updates.

Each round a seeded ``dropout_fraction`` of the sampled clients drops out (its job never reaches
the executor) and a seeded ``corrupt_fraction`` of the others sends an update corrupted in a way
the server must reject (``faults.corrupt``; ``updates.check_update``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..devices import Budget
from ..faults import corrupt, corruption_for, pick
from ..errors import HetflError
from . import Executor, Job, Reply


class FaultInjection(Executor):
    """``inner`` with seeded dropouts and corruptions among the clients ``sampled(round)``."""

    def __init__(self, inner: Executor, seed: int, dropout_fraction: float, corrupt_fraction: float,
                 sampled: Callable[[int], list[int]]):
        if inner.secure:
            raise HetflError("dropout_fraction and corrupt_fraction inject faults into each client's reply, which "
                             "secure aggregation never shows the server; drop them")
        self.inner, self.seed, self.sampled = inner, seed, sampled
        self.dropout_fraction, self.corrupt_fraction = dropout_fraction, corrupt_fraction
        self.name, self.wire = inner.name, inner.wire

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """The inner executor's replies, and no reply for the dropouts, in job order."""
        sampled = self.sampled(round_index)
        dropouts = pick(sampled, self.dropout_fraction, self.seed, "dropout", round_index)
        corrupted = pick([c for c in sampled if c not in dropouts], self.corrupt_fraction, self.seed, "corrupt",
                         round_index)
        held: list[tuple[int, Job]] = []  # dropouts seen while the inner executor draws jobs, by position
        position: dict[int, int] = {}

        def kept():
            for i, job in enumerate(jobs):
                if job.client in dropouts:
                    held.append((i, job))
                else:
                    position[id(job)] = i
                    yield job

        def flush(before: float):
            while held and held[0][0] < before:
                yield held.pop(0)[1], Reply()

        for job, reply in self.inner.execute(kept(), round_index):
            yield from flush(position[id(job)])
            if job.client in corrupted and reply.update is not None:
                reply = Reply(corrupt(reply.update, corruption_for(self.seed, round_index, job.client)),
                              reply.problem, reply.keep, reply.wire_bytes_down, reply.wire_bytes_up)
            yield job, reply
        yield from flush(float("inf"))

    def budget(self, client: int, round_index: int) -> Budget | None:
        """The inner executor's."""
        return self.inner.budget(client, round_index)

    def prepare(self) -> None:
        """Returns None; the inner executor's."""
        self.inner.prepare()

    def state(self) -> dict:
        """The inner executor's."""
        return self.inner.state()

    def restore(self, payload: dict) -> None:
        """Returns None; the inner executor's."""
        self.inner.restore(payload)

    def checkpointed(self) -> None:
        """Returns None; the inner executor's."""
        self.inner.checkpointed()
