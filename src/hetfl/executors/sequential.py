"""The sequential executor: one client after another, in this process (``client.client_update``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .. import client
from . import Executor, Job, LocalClients, Reply


class SequentialExecutor(Executor):
    """Trains each job's client in turn as its jobs are drawn (one client's tensors in memory at a time)."""

    name = "sequential"

    def __init__(self, clients: LocalClients):
        self.clients = clients

    def execute(self, jobs: Iterable[Job], round_index: int) -> Iterator[tuple[Job, Reply]]:
        """Each job with its client's update, in job order."""
        for job in jobs:
            yield job, self.reply(job)

    def reply(self, job: Job) -> Reply:
        """``job``'s client trained here."""
        clients = self.clients
        update, own = client.client_update(job.local, job.task, clients.data(job.client), clients.own(job.client),
                                           models=clients.models)
        return Reply(update, keep=clients.keeper(job.client, own))
