"""The Flower engine's server side: the simulator's rounds, with every client on a SuperNode reached through a Grid.

``FlowerExecutor`` is the executor (``executors``) that sends each sampled client its own
``train`` message (its task and its local tensors only) and waits for the replies until
``round_timeout``; a client that has not replied by then is missing. ``deployment`` composes it
with the simulator's round loop (``sim.Simulation``): sampling, planning, the checks on every
update (``updates.check_update``), aggregation in client order (so the result is bit-identical to
``hetfl run``), evaluation, checkpoints, resume and the run folder.

Which node is which client: at the start and before every round, a node that joined is asked
who it is (a ``query`` message: its node config, ``node.NodeIdentity``); the newest node that
says it is client k serves client k, so a node that restarts takes part again. A node that
states a budget gets its sub-model from it; the others get the scenario's, as in the simulator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from ..devices import Budget
from ..errors import HetflError, warn
from ..executors import Executor, Job, Reply
from ..sim import Simulation
from .grid import exchange
from .identity import NodeIdentity
from .wire import QUERY, TRAIN, Work, read_reply, wire_bytes, work_content

# error replies that Flower makes for a message that got no reply from the ClientApp: the client is missing
NO_REPLY = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE,
            ErrorCode.CLIENT_APP_CRASHED)


def deployment(cfg, grid: Grid, secure=None) -> Simulation:
    """One experiment on Flower: set up like the simulator (validating everything), then ``run``; ``secure``: the
    ``secure.SecureSettings`` of secure aggregation, or None."""
    return Simulation(cfg, executor=lambda sim: flower_executor(sim, grid, secure), on_round=progress_line)


def resume_deployment(run_dir, grid: Grid, secure=None) -> Simulation:
    """The Flower experiment of ``run_dir`` restored at its last checkpoint (with secure aggregation when ``secure``
    or the run folder says so: ``secure.read_settings``)."""
    if secure is None:
        from .secure import read_settings

        secure = read_settings(run_dir)
    return Simulation.resume(run_dir, executor=lambda sim: flower_executor(sim, grid, secure), on_round=progress_line)


def flower_executor(sim: Simulation, grid: Grid, secure=None) -> Executor:
    """The executor of a Flower experiment: ``FlowerExecutor``, or with ``secure`` its SecAgg+ form."""
    if secure is None:
        return FlowerExecutor(sim, grid)
    from .secure import SecureFlowerExecutor

    return SecureFlowerExecutor(sim, grid, secure)


class FlowerExecutor(Executor):
    """Every client on the SuperNode that says it is that client, reached through ``grid``."""

    name = "flower"
    wire = True

    def __init__(self, sim: Simulation, grid: Grid):
        self.sim, self.cfg, self.method = sim, sim.cfg, sim.method
        self.grid = grid
        self.nodes: dict[int, int] = {}  # client -> id of the SuperNode that is this client
        self.budgets: dict[int, Budget] = {}  # client -> the budget its node stated
        self.asked: set[int] = set()  # node ids asked who they are
        self.state_rounds: dict[int, int] = {}  # client -> the round of its last aggregated update: its own state
        self.kept_rounds: dict[int, int] = {}  # the same at the last checkpoint: what a resume starts from

    # ---- nodes ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Returns None; waits for the nodes (``connect``)."""
        self.connect()

    def connect(self) -> None:
        """Returns None; waits up to ``round_timeout`` for a node per client (at least one node, else HetflError)."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.round_timeout
        while True:
            self.discover()
            if len(self.nodes) == cfg.num_clients or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if not self.nodes:
            raise HetflError(f"no SuperNode said who it is within round_timeout ({cfg.round_timeout:g} s); start "
                             f"them with --node-config 'partition-id=K num-partitions={cfg.num_clients}'")
        absent = [c for c in range(cfg.num_clients) if c not in self.nodes]
        if absent:
            warn(f"{len(absent)} of {cfg.num_clients} clients have no SuperNode yet (e.g. client {absent[0]}); they "
                 "are missing from the rounds they are sampled in until one joins")

    def discover(self) -> None:
        """Returns None; asks the nodes that joined since the last call who they are, and maps clients to them."""
        new = sorted(set(self.grid.get_node_ids()) - self.asked)
        if not new:
            return
        self.asked.update(new)
        replies = self.exchange({n: Message(RecordDict(), n, QUERY, ttl=self.cfg.round_timeout) for n in new})
        for node in new:
            try:
                identity = identity_of(replies.get(node))
                client = self.client_of(identity)
                budget = self.node_budget(identity)
            except HetflError as e:
                warn(f"SuperNode {node}: {e}; it takes no part")
                continue
            self.nodes[client] = node
            if budget is None:
                self.budgets.pop(client, None)
            else:
                self.budgets[client] = budget

    def client_of(self, identity: NodeIdentity) -> int:
        """The client a node is: its partition-id, else (its own data, no id) the first client without a node."""
        n = self.cfg.num_clients
        if identity.num_partitions is not None and identity.num_partitions != n:
            raise HetflError(f"its num-partitions {identity.num_partitions} is not the run's num_clients {n}")
        if identity.partition_id is not None:
            if identity.partition_id >= n:
                raise HetflError(f"its partition-id {identity.partition_id} is not a client of the run's {n}")
            return identity.partition_id
        free = [c for c in range(n) if c not in self.nodes]
        if not free:
            raise HetflError(f"all {n} clients of the run have a node already")
        return free[0]

    def node_budget(self, identity: NodeIdentity) -> Budget | None:
        """The budget a node states (a level, or training memory / MACs per sample), checked to fit a sub-model;
        None when it states none (the scenario gives it one)."""
        cfg, method = self.cfg, self.method
        if identity.memory_bytes is not None or identity.macs_per_sample is not None:
            budget = Budget(level=1, memory_bytes=identity.memory_bytes, macs_per_sample=identity.macs_per_sample)
            budget = dataclasses.replace(budget, level=method.level_for(budget))
        elif identity.level is not None:
            if identity.level > cfg.levels:
                raise HetflError(f"its level {identity.level} is not one of the run's levels 1..{cfg.levels}")
            physical = self.sim.scenario.level_budgets
            budget = physical[identity.level - 1] if physical else Budget(level=identity.level)
        else:
            return None
        method.fit(budget)  # a budget below the smallest sub-model cannot train anything
        return budget

    def budget(self, client: int, round_index: int) -> Budget | None:
        """The budget ``client``'s node stated, or None (the scenario's applies)."""
        return self.budgets.get(client)

    # ---- a round ---------------------------------------------------------------------------
    def exchange(self, messages: dict) -> dict:
        """The replies to ``messages`` (key -> Message) that arrive within ``round_timeout``, by the same keys."""
        return exchange(self.grid, messages, self.cfg.round_timeout)

    def execute(self, jobs, round_index: int):
        """Each job with its node's reply, in job order: one ``train`` message per client that has a node, all
        sent at once; whatever has not replied within ``round_timeout`` is missing."""
        self.discover()
        jobs = list(jobs)
        messages = {job.client: Message(work_content(self.work(job)), self.nodes[job.client], TRAIN,
                                        ttl=self.cfg.round_timeout, group_id=str(round_index))
                    for job in jobs if job.client in self.nodes}
        replies = self.exchange(messages)
        for job in jobs:
            message, reply = messages.get(job.client), replies.get(job.client)
            down = wire_bytes(message.content) if message is not None else 0
            up = wire_bytes(reply.content) if reply is not None and reply.has_content() else 0
            yield job, dataclasses.replace(self.reply_of(job, reply), wire_bytes_down=down, wire_bytes_up=up)

    def work(self, job: Job) -> Work:
        """What the job's node needs: the task, the local tensors, the data and which own state to start from."""
        cfg = self.cfg
        data = {"dataset": cfg.dataset, "num_clients": cfg.num_clients, "partition": cfg.partition,
                "alpha": cfg.alpha, "classes_per_client": cfg.classes_per_client,
                "min_client_size": cfg.min_client_size, "client_test_fraction": cfg.client_test_fraction,
                "seed": cfg.seed, **({"holdout": self.sim.holdout} if self.sim.holdout else {})}
        run = hashlib.sha256(str(self.sim.run_dir.resolve()).encode()).hexdigest()[:16]
        return Work(job.task, job.local, data, run, self.state_rounds.get(job.client, 0),
                    self.kept_rounds.get(job.client, 0))

    def reply_of(self, job: Job, message: Message | None) -> Reply:
        """The ``Reply`` a node's message makes: an update, a problem, or nothing (no message, or Flower's error
        for a message that got no reply)."""
        if message is None:
            return Reply()
        if message.has_error():
            if message.error.code in NO_REPLY:
                return Reply()
            return Reply(problem=f"the client failed: {message.error.reason}")
        try:
            update = read_reply(message.content)
        except ValueError as e:
            return Reply(problem=str(e))
        keep = None
        if self.method.stateful_clients:  # its node now keeps the state of this round for it
            keep = lambda client=job.client, t=job.task.round: self.state_rounds.__setitem__(client, t)  # noqa: E731
        return Reply(update, keep=keep)

    # ---- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict:
        """The round of each client's own state on its node, which a resume starts from."""
        return {"state_rounds": dict(self.state_rounds)}

    def restore(self, payload: dict) -> None:
        """Returns None; restores ``state``."""
        self.state_rounds = dict(payload.get("state_rounds", {}))
        self.kept_rounds = dict(self.state_rounds)

    def checkpointed(self) -> None:
        """Returns None; lets the nodes forget the own states no resume can need any more."""
        self.kept_rounds = dict(self.state_rounds)


def progress_line(sim: Simulation, record: dict) -> None:
    """Returns None; prints one line of progress (``hetfl deploy`` and ``flwr run --stream`` show it)."""
    n = record["clients"]
    parts = [f"hetfl: round {record['round']}/{sim.cfg.rounds}: {n} update{'' if n == 1 else 's'} aggregated"]
    if record["train_loss"] is not None:
        parts.append(f"loss {record['train_loss']:.4f}")
    if record["eval"]:
        parts.append(f"accuracy {sim.headline(record['eval']):.4f}")
    if record["missing"]:
        parts.append(f"missing {record['missing']}")
    if record["rejected"]:
        parts.append(f"rejected {sorted(map(int, record['rejected']))}")
    parts.append(f"{record['wire_bytes_down']} B down, {record['wire_bytes_up']} B up")
    print(", ".join(parts), flush=True)


def identity_of(message: Message | None) -> NodeIdentity:
    """The identity in a node's reply to ``query``; HetflError when there is none."""
    if message is None:
        raise HetflError("it did not say who it is within round_timeout")
    if message.has_error():
        raise HetflError(f"its ClientApp failed to say who it is: {message.error.reason}")
    return NodeIdentity.from_config(dict(message.content["config"]))
