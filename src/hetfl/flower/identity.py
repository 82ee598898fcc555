"""Who a SuperNode is: its node config, checked (torch-free, so a node answers the server's query in a moment).

Node config keys (``flower-supernode --node-config 'partition-id=0 num-partitions=4 level=2'``):

* ``partition-id``, ``num-partitions``: the node is client ``partition-id`` and trains on that
  partition of the run's dataset, cut exactly as the simulator cuts it for the same seed; or
* ``data-path``: the node trains on its own files (an ``.npz`` file or a folder of IDX files, see
  docs/data.md), normalised with their own statistics; ``partition-id`` then only names it;
* ``level`` (1..levels), ``memory-bytes``, ``macs-per-sample``: its device budget (default: the
  run's scenario gives it one, as in the simulator);
* ``data-dir``: where it finds the run's dataset files; ``state-dir``: where it keeps its clients'
  own state and its data cache (default ``~/.cache/hetfl/node-state``);
* ``worker``: ``on`` (default: the node's messages are trained by its warm worker, ``worker``) or
  ``off`` (each message is trained in the ClientApp process Flower starts for it, cold);
* ``corrupt``: a corruption (``faults.CORRUPTIONS``) applied to every reply, for tests and study.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import HetflError
from ..paths import cache_root

INT_KEYS = ("partition-id", "num-partitions", "level", "memory-bytes", "macs-per-sample")
TEXT_KEYS = ("data-path", "data-dir", "state-dir", "worker", "corrupt")
WORKER_CHOICES = ("on", "off")


@dataclass(frozen=True)
class NodeIdentity:
    """What a node's config says about it (``INT_KEYS``, ``TEXT_KEYS``); None where it says nothing."""

    partition_id: int | None = None
    num_partitions: int | None = None
    data_path: str | None = None
    level: int | None = None
    memory_bytes: int | None = None
    macs_per_sample: int | None = None
    data_dir: str | None = None
    state_dir: str | None = None
    worker: str | None = None
    corrupt: str | None = None

    @classmethod
    def from_config(cls, config: dict) -> NodeIdentity:
        """The identity in a node config; HetflError naming the first bad key and what is allowed."""
        values = {}
        for key, value in config.items():
            if key in INT_KEYS:
                if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "partition-id" else 1):
                    raise HetflError(f"node config {key} must be an integer >= {0 if key == 'partition-id' else 1}, "
                                     f"got {value!r}")
            elif key in TEXT_KEYS:
                if not isinstance(value, str) or not value:
                    raise HetflError(f"node config {key} must be a non-empty string, got {value!r}")
            else:
                raise HetflError(f"node config key '{key}' is unknown; allowed: {', '.join(INT_KEYS + TEXT_KEYS)}")
            values[key.replace("-", "_")] = value
        identity = cls(**values)
        if identity.worker not in (None, *WORKER_CHOICES):
            raise HetflError(f"node config worker must be one of {', '.join(WORKER_CHOICES)}, got {identity.worker!r}")
        if (identity.partition_id is None) != (identity.num_partitions is None) and identity.data_path is None:
            raise HetflError("node config needs both partition-id and num-partitions (or data-path)")
        if identity.partition_id is None and identity.data_path is None:
            raise HetflError("node config must say partition-id and num-partitions (a partition of the run's "
                             "dataset) or data-path (the node's own data)")
        if None not in (identity.partition_id, identity.num_partitions) and \
                identity.partition_id >= identity.num_partitions:
            raise HetflError(f"node config partition-id {identity.partition_id} must be below num-partitions "
                             f"{identity.num_partitions}")
        return identity

    @property
    def state_root(self) -> Path:
        """The folder holding the node's own state, data cache and worker (``state-dir``, default
        $HETFL_CACHE/node-state, else ~/.cache/hetfl/node-state)."""
        return Path(self.state_dir).expanduser() if self.state_dir else cache_root() / "node-state"

    @property
    def warm(self) -> bool:
        """Whether the node's messages go to its warm worker (node config ``worker``, default on)."""
        return self.worker != "off"

    def to_config(self) -> dict:
        """The node config keys this identity sets (the inverse of ``from_config``)."""
        return {k.replace("_", "-"): v for k, v in self.__dict__.items() if v is not None}
