"""A SuperNode's side of a round: its client's data, its clients' own state on its disk, and the training of a
``train`` message (``NodeTrainer``: the cold ClientApp makes one per message, the warm worker keeps one).

A client's own state (FedDyn's g_k) is kept per run and per round: the server says which round's
state a job starts from (that of the client's last update it aggregated) and from which round on
the node must keep them (what its last checkpoint needs), so neither a reply the server rejected
or never received nor a server resumed from an older checkpoint ever sees a state it did not keep.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..client import client_update
from ..data import load_dataset, split_train_test
from ..data.partition import partition_among
from ..data.server import client_indices
from ..errors import HetflError
from ..faults import corrupt
from ..models.cache import ModelCache, family_of
from ..rundir import atomic_torch_save
from ..slicing import State
from ..trainers.schedule import ClientData
from .identity import NodeIdentity
from .slots import training_slot

if TYPE_CHECKING:  # Flower is imported by the methods that read and write its records
    from flwr.app import RecordDict


def client_data(node: NodeIdentity, client: int, data: dict) -> ClientData:
    """The samples client ``client`` trains on: the node's own files, or its partition of the run's dataset
    (``data``: the run's dataset and partition options), cut once and then read from the node's cache."""
    if node.data_path:
        path = Path(node.data_path).expanduser()
        dataset = load_dataset(f"{'idx' if path.is_dir() else 'npz'}:{path}")
        return ClientData(dataset.x_train, dataset.y_train, torch.arange(len(dataset.y_train)))
    key = hashlib.sha256(json.dumps({**data, "client": client}, sort_keys=True).encode()).hexdigest()[:16]
    cache = node.state_root / "data" / f"{key}.pt"
    if cache.exists():
        part = torch.load(cache, weights_only=True)
    else:
        dataset = load_dataset(data["dataset"], node.data_dir)
        held = client_indices(len(dataset.y_train), data.get("holdout", 0), data["seed"])  # FedDF's server set
        parts = partition_among(dataset.y_train, held, data["num_clients"], data["partition"], alpha=data["alpha"],
                                classes_per_client=data["classes_per_client"], min_size=data["min_client_size"],
                                seed=data["seed"])
        if data["client_test_fraction"] > 0:  # the client's held-out test split never trains
            parts, _ = split_train_test(parts, data["client_test_fraction"], data["seed"])
        idx = parts[client]
        part = {"x": dataset.x_train[idx].clone(), "y": dataset.y_train[idx].clone()}
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(part, cache)
    return ClientData(part["x"], part["y"], torch.arange(len(part["y"])))


class OwnStates:
    """One client's own states on a node, one file per round that left one, for one run."""

    def __init__(self, root: Path, run: str, client: int):
        self.folder = Path(root) / "runs" / run / f"client-{client}"

    def load(self, round_index: int) -> State | None:
        """The state the client's update of ``round_index`` left (None for round 0: no state yet)."""
        if round_index == 0:
            return None
        path = self.folder / f"round-{round_index}.pt"
        if not path.exists():
            raise HetflError(f"this node has no own state of round {round_index} for the client (was its disk "
                             f"wiped, or is it another node?); it cannot train this task exactly")
        return torch.load(path, weights_only=True)

    def save(self, round_index: int, state: State, keep_round: int) -> None:
        """Returns None; keeps ``state`` as the one of ``round_index`` and forgets those before ``keep_round``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_torch_save({k: v.cpu() for k, v in state.items()}, self.folder / f"round-{round_index}.pt")
        for path in self.folder.glob("round-*.pt"):
            if int(path.stem.removeprefix("round-")) < keep_round:
                path.unlink(missing_ok=True)


class Phases:
    """Wall seconds between laps, by name (a message's breakdown)."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        """Returns None; the seconds since the last lap go to ``name``."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


class NodeTrainer:
    """A node's training of its ``train`` messages, holding its client's samples and the sub-model objects
    (``ModelCache``) across messages; the client's own state is read from and written to the node's disk every
    time, so a trainer that is new or kept long trains a message the same way."""

    def __init__(self, node: NodeIdentity):
        self.node = node
        self.samples: dict[str, ClientData] = {}
        self.models: dict[tuple, ModelCache] = {}
        self.phases: dict[str, float] = {}  # the last message's seconds per phase (the warm worker logs them)

    def train(self, content: RecordDict) -> RecordDict:
        """The reply content to a ``train`` message's ``content``: the client's update of its task."""
        from .secure_wire import LAYOUT
        from .wire import read_work, reply_content

        clock = Phases()
        work = read_work(content)
        task = work.task
        clock.lap("unpack")
        data = self.client_data(task.client, work.data)
        clock.lap("data")
        if tuple(data.x.shape[1:]) != tuple(task.family.input_shape):
            raise ValueError(f"this node's samples have shape {tuple(data.x.shape[1:])}, the run's model takes "
                             f"{tuple(task.family.input_shape)}")
        key = (task.family, task.scaler)
        if key not in self.models:
            self.models[key] = ModelCache(family_of(task.family), data.x.device, scaler=task.scaler)
        states = OwnStates(self.node.state_root, work.run, task.client)
        own = states.load(work.state_round)
        clock.lap("state-read")
        with training_slot():  # on a machine whose nodes outnumber its cores, a turn (``slots``)
            clock.lap("slot-wait")
            cpu = time.process_time()
            update, own = client_update(work.local, task, data, own, self.models[key])
            clock.lap("train")
            clock.phases["train-cpu"] = time.process_time() - cpu
        if own is not None:
            states.save(task.round, own, work.keep_round)
        clock.lap("state-write")
        if self.node.corrupt:
            update = corrupt(update, self.node.corrupt)
        if LAYOUT in content["config"]:  # secure aggregation: the vector SecAgg+ masks (``secure``)
            from .secure_vector import secure_reply

            reply = secure_reply(update, work, content["config"])
        else:
            reply = reply_content(update)
        clock.lap("pack")
        self.phases = clock.phases
        return reply

    def client_data(self, client: int, data: dict) -> ClientData:
        """``client_data``, kept in memory after the first message."""
        key = json.dumps({**data, "client": client}, sort_keys=True)
        if key not in self.samples:
            self.samples[key] = client_data(self.node, client, data)
        return self.samples[key]
