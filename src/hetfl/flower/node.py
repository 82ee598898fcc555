"""A SuperNode's side of a round: its client's data and its clients' own state on its disk.

A client's own state (FedDyn's g_k) is kept per run and per round: the server says which round's
state a job starts from (that of the client's last update it aggregated) and from which round on
the node must keep them (what its last checkpoint needs), so neither a reply the server rejected
or never received nor a server resumed from an older checkpoint ever sees a state it did not keep.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..data import load_dataset, split_train_test
from ..data.partition import partition_among
from ..data.server import client_indices
from ..data.datasets import cache_root
from ..errors import HetflError
from ..rundir import atomic_torch_save
from ..slicing import State
from ..trainers.schedule import ClientData
from .identity import NodeIdentity


def state_root(node: NodeIdentity) -> Path:
    """The folder holding the node's own state and data cache (``state-dir``, default ~/.cache/hetfl/node-state)."""
    return Path(node.state_dir).expanduser() if node.state_dir else cache_root() / "node-state"


def client_data(node: NodeIdentity, client: int, data: dict) -> ClientData:
    """The samples client ``client`` trains on: the node's own files, or its partition of the run's dataset
    (``data``: the run's dataset and partition options), cut once and then read from the node's cache."""
    if node.data_path:
        path = Path(node.data_path).expanduser()
        dataset = load_dataset(f"{'idx' if path.is_dir() else 'npz'}:{path}")
        return ClientData(dataset.x_train, dataset.y_train, torch.arange(len(dataset.y_train)))
    key = hashlib.sha256(json.dumps({**data, "client": client}, sort_keys=True).encode()).hexdigest()[:16]
    cache = state_root(node) / "data" / f"{key}.pt"
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
