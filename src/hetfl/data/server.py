"""Unlabeled data a method keeps on the server (FedDF's distillation set), never the test set.

Two sources, named by the method's ``distill_dataset`` option:

* ``holdout``: ``size`` samples of the training set, drawn with the run's seed and taken away before the clients'
  partition, so no client holds them; their labels are dropped.
* another dataset's name (``r8`` for a 20 Newsgroups run, ``mnist`` once fetched for Fashion-MNIST, ``cifar100`` for
  CIFAR-10, as ScaleFL Sec. 4.3 pairs CIFAR-10/100 and SST-2/AgNews): ``size`` samples of its training set, with
  inputs of the run's shape. Its labels are dropped too; the clients keep all of the run's training set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import HetflError
from ..seeding import torch_generator
from .datasets import Dataset, load_dataset

HOLDOUT = "holdout"


@dataclass
class ServerData:
    """The server's unlabeled inputs, and the training indices the clients may hold (None: all of them)."""

    x: torch.Tensor
    client_indices: torch.Tensor | None


def server_data(source: str, size: int, dataset: Dataset, seed: int, data_dir: str | None = None,
                max_length: int = 128) -> ServerData:
    """``size`` unlabeled inputs (0: a tenth of ``dataset``'s training set) from ``source`` (``holdout`` or a dataset
    name) for a run on ``dataset``."""
    size = size or max(len(dataset.y_train) // 10, 2)
    if source == HOLDOUT:
        n = len(dataset.y_train)
        if not 0 < size <= n // 2:
            raise HetflError(f"distill_size {size} would hold out more than half of {dataset.name}'s {n} training "
                             f"samples; use at most {n // 2}")
        drawn = _order(n, seed)
        return ServerData(dataset.x_train[drawn[:size]], drawn[size:].sort().values)
    if source == dataset.name:
        raise HetflError(f"distill_dataset {source} is the run's own dataset, whose training samples the clients "
                         f"hold; use 'holdout' for a part of it no client holds, or another dataset")
    other = load_dataset(source, data_dir, max_length)
    if other.input_shape != dataset.input_shape:
        raise HetflError(f"distill_dataset {source}'s inputs have shape {other.input_shape}, the run's "
                         f"{dataset.name} {dataset.input_shape}; use a dataset of the same shape, or 'holdout'")
    return ServerData(other.x_train[_order(len(other.x_train), seed)[:size]], None)


def _order(n: int, seed: int) -> torch.Tensor:
    """The run's draw of the server's samples among ``n``."""
    return torch.randperm(n, generator=torch_generator(seed, "server-data"))


def client_indices(n: int, holdout: int, seed: int) -> torch.Tensor | None:
    """The training indices the clients may hold when the server holds ``holdout`` of the ``n`` out (None: all): what
    ``server_data`` leaves them, for a Flower node that cuts its client's partition itself."""
    return _order(n, seed)[holdout:].sort().values if holdout else None
