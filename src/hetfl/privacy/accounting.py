"""The privacy accountant: epsilon of a run's rounds, and the noise multiplier that spends a target epsilon.

Google's ``dp-accounting`` (the library behind TensorFlow Privacy and TensorFlow Federated) with its Renyi-DP
accountant, because it is the one that accounts for hetfl's sampling as it is: a fixed number m of the N clients
each round, drawn uniformly without replacement (``Simulation.sample_clients``), under *replace-one-client*
adjacency, the relation that sampling needs (``SampledWithoutReplacementDpEvent``; Wang, Balle and Kasiviswanathan,
"Subsampled Renyi Differential Privacy", AISTATS 2019, Thm. 27). Its PLD accountant is tighter but takes only
Poisson sampling, which hetfl does not do, and Opacus' and pfl-research's accountants take only Poisson too.

Under replace-one, a client's clipped update u (|u| <= C) may be replaced by another u', so the masked sums move
by |u - u'| <= 2C: noise of standard deviation z C on them is a Gaussian mechanism of noise multiplier z / 2 in
the accountant's units (std / sensitivity). ``effective_multiplier`` is that conversion, with adaptive clipping's
bits composed in (``mechanism.DPSettings``). Rounds compose by adding their RDP curves, so the curve of one round
is computed once per (z, N, m) and epsilon after any round is read from t times it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import HetflError

MAX_NOISE_MULTIPLIER = 1000.0  # calibration searches z in (0, this]


def dp_accounting():
    """The ``dp_accounting`` package; HetflError saying how to install it when it is missing."""
    try:
        import dp_accounting
    except ImportError:
        raise HetflError("differential privacy needs Google's dp-accounting for its accountant: "
                         "pip install 'hetfl[privacy]'") from None
    return dp_accounting


def round_event(effective: float, clients: int, per_round: int):
    """One round as a DpEvent: ``per_round`` of ``clients`` sampled without replacement, then a Gaussian
    mechanism of noise multiplier ``effective`` (std / sensitivity) on their sums."""
    dpa = dp_accounting()
    return dpa.SampledWithoutReplacementDpEvent(clients, per_round, dpa.GaussianDpEvent(effective))


@lru_cache(maxsize=256)
def _round_rdp(effective: float, clients: int, per_round: int) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP of one round at each order): the library's default orders."""
    dpa = dp_accounting()
    accountant = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(round_event(effective, clients, per_round))
    return np.asarray(accountant.orders), np.asarray(accountant.rdp)


def epsilon(effective: float, clients: int, per_round: int, rounds: int, delta: float) -> float:
    """The epsilon at ``delta`` after ``rounds`` rounds (0 rounds: 0)."""
    if rounds <= 0:
        return 0.0
    orders, rdp = _round_rdp(float(effective), int(clients), int(per_round))
    eps, _ = dp_accounting().rdp.rdp_privacy_accountant.compute_epsilon(orders, rounds * rdp, delta)
    return float(eps)


@lru_cache(maxsize=64)  # a preset's runs share their targets: each is calibrated once per process
def calibrate(target: float, effective, clients: int, per_round: int, rounds: int, delta: float,
              highest: float = MAX_NOISE_MULTIPLIER) -> float:
    """The smallest noise multiplier z in (0, ``highest``] (within 1e-4 z) whose run spends at most ``target`` epsilon
    at ``delta``, with ``effective(z)`` the accountant's multiplier of z: a bracket [z / 2, z] found by doubling or
    halving from 1, then the library's own calibration in it (Brent's method, ``calibrate_dp_mechanism``).
    HetflError when even ``highest`` spends more."""
    dpa = dp_accounting()
    spent = lambda z: epsilon(effective(z), clients, per_round, rounds, delta)  # noqa: E731
    if spent(highest) > target:
        raise HetflError(f"no noise multiplier up to {highest:g} spends at most epsilon {target:g} over {rounds} "
                         f"rounds of {per_round} of {clients} clients at delta {delta:g} (it spends "
                         f"{spent(highest):.3g}); ask for a larger --dp-target-epsilon or --dp-delta, or fewer rounds")
    high = min(1.0, highest)
    while spent(high) > target:  # ends: ``highest`` meets the target
        high = min(2 * high, highest)
    while high / 2 > 1e-6 and spent(high / 2) <= target:
        high /= 2
    return float(dpa.mechanism_calibration.calibrate_dp_mechanism(
        lambda: dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE),
        lambda z: dpa.SelfComposedDpEvent(round_event(effective(z), clients, per_round), rounds),
        target, delta, dpa.mechanism_calibration.ExplicitBracketInterval(high / 2, high), tol=1e-4 * high))
