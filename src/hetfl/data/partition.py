"""Splitting a dataset's samples over clients: iid, Dirichlet label skew (equal or unequal sizes), pathological.

Every scheme is complete and disjoint (each sample goes to exactly one client) and a pure function of
its arguments: randomness comes only from ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import HetflError

SCHEMES = ("iid", "dirichlet", "dirichlet-unequal", "pathological")
DIRICHLET_TURNS = 10  # equal-size Dirichlet: clients fill their quota in this many turns (see _dirichlet_equal)
MAX_REDRAWS = 1000  # unequal Dirichlet: attempts to reach min_size before giving up


def partition(labels: torch.Tensor, num_clients: int, scheme: str = "iid", *, alpha: float = 0.5,
              classes_per_client: int = 2, min_size: int = 10, seed: int = 0) -> list[torch.Tensor]:
    """One sorted int64 tensor of sample indices per client, splitting all of ``labels`` by ``scheme``."""
    y = _label_array(labels)
    if scheme not in SCHEMES:
        raise HetflError(f"partition scheme {scheme!r} is unknown; choose one of: {', '.join(SCHEMES)}")
    if not 1 <= num_clients <= len(y):
        raise HetflError(f"num_clients must be between 1 and the number of samples ({len(y)}), got {num_clients}")
    if scheme.startswith("dirichlet") and not alpha > 0:
        raise HetflError(f"partition alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return _to_tensors(np.array_split(rng.permutation(len(y)), num_clients))
    pools = _class_pools(y, rng)
    if scheme == "dirichlet":
        counts = _dirichlet_equal(pools, num_clients, alpha, rng)
    elif scheme == "dirichlet-unequal":
        counts = _dirichlet_unequal(pools, num_clients, alpha, min_size, rng)
    else:
        counts = _pathological(pools, num_clients, classes_per_client, rng)
    return _to_tensors(_assign(pools, counts))


def split_train_test(parts: list[torch.Tensor], test_fraction: float,
                     seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each client's indices split into (train, test) lists; the test part holds round(size * test_fraction)."""
    if not 0 <= test_fraction < 1:
        raise HetflError(f"client_test_fraction must be in [0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for part in parts:
        shuffled = part[torch.from_numpy(rng.permutation(len(part)))]
        cut = len(part) - round(len(part) * test_fraction)
        train.append(shuffled[:cut].sort().values)
        test.append(shuffled[cut:].sort().values)
    return train, test


def class_histogram(labels: torch.Tensor, parts: list[torch.Tensor], num_classes: int) -> torch.Tensor:
    """An int64 (clients, classes) tensor: how many samples of each class each client holds."""
    labels = labels.cpu()
    if len(labels) and int(labels.max()) >= num_classes:
        raise HetflError(f"num_classes must exceed every label, got {num_classes} for label {int(labels.max())}")
    rows = [torch.bincount(labels[p.cpu()], minlength=num_classes) for p in parts]
    return torch.stack(rows) if rows else torch.zeros(0, num_classes, dtype=torch.int64)


# ---------------------------------------------------------------- helpers


def _label_array(labels: torch.Tensor) -> np.ndarray:
    """``labels`` as a 1-D numpy int64 array, after checking they are non-negative integers."""
    y = torch.as_tensor(labels).cpu()
    if y.ndim != 1 or y.is_floating_point() or y.is_complex() or (len(y) and int(y.min()) < 0):
        raise HetflError(f"partition labels must be a 1-D tensor of non-negative integer classes, "
                         f"got {y.dtype} {tuple(y.shape)}")
    return y.numpy().astype(np.int64)


def _to_tensors(parts: list[np.ndarray]) -> list[torch.Tensor]:
    """The index arrays as sorted int64 tensors."""
    return [torch.from_numpy(np.sort(p).astype(np.int64)) for p in parts]


def _class_pools(y: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """For each class present in ``y`` (ascending), its sample indices in random order."""
    order = np.argsort(y, kind="stable")
    _, sizes = np.unique(y, return_counts=True)
    return [rng.permutation(pool) for pool in np.split(order, np.cumsum(sizes)[:-1])]


def _assign(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Each client's indices: client k takes counts[k, c] consecutive samples from class c's shuffled pool."""
    pieces: list[list[np.ndarray]] = [[] for _ in range(len(counts))]
    for c, pool in enumerate(pools):
        for k, piece in enumerate(np.split(pool, np.cumsum(counts[:, c])[:-1])):
            pieces[k].append(piece)
    return [np.concatenate(p) for p in pieces]


def _equal_sizes(total: int, parts: int) -> np.ndarray:
    """``parts`` sizes summing to ``total`` that differ by at most 1, larger first."""
    return total // parts + (np.arange(parts) < total % parts)


def _draw_capped(n: int, q: np.ndarray, room: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-class counts of ``n`` draws from proportions ``q`` limited to classes with ``room`` left.

    Draws beyond a class's room are redrawn among the classes still open (``q`` renormalised), so each
    pass either finishes or closes a class.
    """
    take = np.zeros_like(room)
    while n > 0:
        left = room - take
        p = np.where(left > 0, q, 0.0)
        if p.sum() <= 0:  # q puts no mass on the open classes (tiny alpha): take what is left
            p = left.astype(float)
        drawn = np.minimum(rng.multinomial(n, p / p.sum()), left)
        take += drawn
        n -= int(drawn.sum())
    return take


def _dirichlet_equal(pools: list[np.ndarray], num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """(clients, classes) counts: equal client sizes, client k's classes drawn from q_k ~ Dir(alpha).

    Clients fill their quota in DIRICHLET_TURNS turns, in a random order each turn, so the classes that
    run out late are not all dumped on the last clients.
    """
    room = np.array([len(p) for p in pools])
    q = rng.dirichlet(np.full(len(pools), alpha), size=num_clients)
    quotas = np.stack([_equal_sizes(int(s), DIRICHLET_TURNS) for s in _equal_sizes(int(room.sum()), num_clients)])
    counts = np.zeros((num_clients, len(pools)), dtype=np.int64)
    for turn in range(DIRICHLET_TURNS):
        for k in rng.permutation(num_clients):
            drawn = _draw_capped(int(quotas[k, turn]), q[k], room, rng)
            counts[k] += drawn
            room -= drawn
    return counts


def _dirichlet_unequal(pools: list[np.ndarray], num_clients: int, alpha: float, min_size: int,
                       rng: np.random.Generator) -> np.ndarray:
    """(clients, classes) counts: each class split over clients by Dir(alpha), redrawn until all reach min_size.

    The classic scheme (Yurochkin et al. 2019; Li et al. 2021): a client already holding N / clients samples
    gets no more, which keeps sizes from running away.
    """
    total = sum(len(p) for p in pools)
    if not 0 <= min_size <= total // num_clients:
        raise HetflError(f"min_client_size must be between 0 and samples / num_clients ({total // num_clients}), "
                         f"got {min_size}")
    for _ in range(MAX_REDRAWS):
        counts = np.zeros((num_clients, len(pools)), dtype=np.int64)
        for c, pool in enumerate(pools):
            hungry = counts.sum(1) < total / num_clients
            p = rng.dirichlet(np.full(num_clients, alpha)) * hungry
            p = p if p.sum() > 0 else hungry.astype(float)  # a tiny alpha can put all mass on full clients
            cuts = (np.cumsum(p / p.sum()) * len(pool)).astype(int)[:-1]
            counts[:, c] = np.diff(cuts, prepend=0, append=len(pool))
        if counts.sum(1).min() >= min_size:
            return counts
    raise HetflError(f"min_client_size {min_size} is too large for alpha {alpha} and {num_clients} clients "
                     f"(no split reached it in {MAX_REDRAWS} draws); lower it, raise alpha or use fewer clients")


def _pathological(pools: list[np.ndarray], num_clients: int, classes_per_client: int,
                  rng: np.random.Generator) -> np.ndarray:
    """(clients, classes) counts: each client holds exactly ``classes_per_client`` classes, spread evenly.

    Clients in turn pick the classes with the fewest holders so far (ties broken at random); each class's
    samples are then split equally among its holders.
    """
    num_classes = len(pools)
    if not 1 <= classes_per_client <= num_classes:
        raise HetflError(f"classes_per_client must be between 1 and the number of classes ({num_classes}), "
                         f"got {classes_per_client}")
    if num_clients * classes_per_client < num_classes:
        raise HetflError(f"pathological partition leaves classes without a client: num_clients * classes_per_client "
                         f"= {num_clients * classes_per_client} < {num_classes} classes; raise either")
    holds = np.zeros((num_clients, num_classes), dtype=bool)
    for k in range(num_clients):
        fewest_first = np.lexsort((rng.random(num_classes), holds.sum(0)))
        holds[k, fewest_first[:classes_per_client]] = True
    counts = np.zeros(holds.shape, dtype=np.int64)
    for c, pool in enumerate(pools):
        holders = np.flatnonzero(holds[:, c])
        if len(pool) < len(holders):
            raise HetflError(f"pathological partition: a class has {len(pool)} samples for {len(holders)} clients; "
                             f"lower num_clients or classes_per_client")
        counts[holders, c] = _equal_sizes(len(pool), len(holders))
    return counts


def partition_among(labels: torch.Tensor, indices: torch.Tensor | None, num_clients: int, scheme: str = "iid",
                    **options) -> list[torch.Tensor]:
    """``partition`` of the samples ``indices`` of ``labels`` only (None: all), as indices into ``labels``: the
    clients' split when the server holds some training samples out (FedDF's holdout, ``data.server``)."""
    if indices is None:
        return partition(labels, num_clients, scheme, **options)
    return [indices[p] for p in partition(labels[indices], num_clients, scheme, **options)]
