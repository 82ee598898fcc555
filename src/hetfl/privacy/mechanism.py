"""The server's part of DP-FedAvg: Gaussian noise on the masked sums, adaptive clipping, the epsilon spent
(``privacy``, steps 2-4).

``DPSettings`` are the mechanism's numbers, resolved from a config (the noise multiplier calibrated to a target
epsilon where one is asked for); ``PrivateAggregation`` runs a method's aggregation with noise added to each of its
masked sums before the division by the counts (``Method.perturb``), keeps the clip norm between rounds in the server
state (``dp/clip``, checkpointed with it) and says what each round spent (``RoundLog.privacy``).

Choices where the papers leave one:

* Weights are uniform (``aggregation_weights = uniform`` is forced with DP): with sample-count weights a client's
  share of the sum, hence the sensitivity, would depend on its private sample count.
* Label masking (HeteroFL, FedRolex) keeps its local part, the masked logits, but every classifier row counts every
  client that holds it: per-class counts would depend on which classes each client holds.
* Adaptive clipping (Andrew et al. 2021, Alg. 1 and Thm. 1): C <- C exp(-eta (b - gamma)), b the noised fraction of
  the round's m clients whose update was within C, the bits' sum noised with std sigma_b (default m / 20, the
  paper's choice). The updates' noise multiplier z_u is raised so that the bits and the updates together spend what
  fixed clipping at z would: z_u = (z^-2 - (2 sigma_b)^-2)^(-1/2), which needs z < 2 sigma_b.
* Noise is drawn from a generator seeded by (seed, "dp-noise", round) in the simulator, so a run and its resume are
  reproducible; where updates travel over a network (``hetfl deploy``) from a generator seeded by the operating
  system's entropy, as a seed in a config file would let anyone subtract the noise.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from ..aggregation import MaskedMean, ServerState
from ..errors import HetflError
from ..seeding import torch_generator
from ..slicing import extract
from ..updates import Update
from . import accounting
from .clipping import WITHIN_CLIP

CLIP_KEY = "dp/clip"  # the clip norm C between rounds, in ServerState.extra


@dataclass(frozen=True)
class DPSettings:
    """The mechanism of a run: noise multiplier ``noise_multiplier`` (z: the noise std on the sums in units of C,
    as fixed clipping spends), ``delta``, the clip norm ``clip`` (the first round's with adaptive clipping), the
    target ``quantile`` of adaptive clipping (0: fixed clipping), its step ``clip_lr`` (eta) and the bits' noise
    ``count_noise`` (sigma_b), for ``clients`` clients of which ``per_round`` take part in each of ``rounds``."""

    noise_multiplier: float
    delta: float
    clip: float
    quantile: float
    clip_lr: float
    count_noise: float
    clients: int
    per_round: int
    rounds: int

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm follows a quantile of the update norms."""
        return self.quantile > 0

    @property
    def update_noise(self) -> float:
        """z_u: the std of the noise on the update sums, in units of C (z itself with fixed clipping)."""
        if not self.adaptive:
            return self.noise_multiplier
        return (self.noise_multiplier ** -2 - (2 * self.count_noise) ** -2) ** -0.5

    def epsilon(self, rounds: int) -> float:
        """The epsilon at ``delta`` after ``rounds`` rounds."""
        return accounting.epsilon(effective_multiplier(self.noise_multiplier), self.clients, self.per_round, rounds,
                                  self.delta)


def effective_multiplier(z: float) -> float:
    """The accountant's noise multiplier (std / sensitivity) of noise z C on sums of updates clipped to C, under
    replace-one adjacency (sensitivity 2C): z / 2. With adaptive clipping the bits are composed in (Andrew et al.
    2021, Thm. 1) and the updates' noise raised to keep the same total (``DPSettings.update_noise``), so it is z / 2
    there too."""
    return z / 2


def default_delta(clients: int) -> float:
    """delta when none is given: clients^-1.1, below 1 / clients (a delta of 1 / clients would allow a mechanism
    that publishes one client's data whole)."""
    return clients ** -1.1


def settings_of(cfg) -> DPSettings:
    """The mechanism ``cfg`` asks for, its noise multiplier calibrated when it names a target epsilon; HetflError when
    the options cannot be met."""
    per_round = cfg.clients_per_round
    delta = cfg.dp_delta or default_delta(cfg.num_clients)
    count_noise = cfg.dp_clip_count_noise or per_round / 20
    adaptive = cfg.dp_clip_quantile > 0
    highest = 2 * count_noise * (1 - 1e-9) if adaptive else accounting.MAX_NOISE_MULTIPLIER
    if cfg.dp_target_epsilon:
        try:
            z = accounting.calibrate(cfg.dp_target_epsilon, effective_multiplier, cfg.num_clients, per_round,
                                     cfg.rounds, delta, highest)
        except HetflError as e:
            if adaptive:
                raise HetflError(f"{e}; with adaptive clipping the noise multiplier stays below 2 sigma_b = "
                                 f"{2 * count_noise:g} (sigma_b: --dp-clip-count-noise, default clients per round / "
                                 f"20): use fixed clipping (--dp-clip-quantile 0) or more clients per round") from None
            raise
    else:
        z = cfg.dp_noise_multiplier
        if adaptive and z >= 2 * count_noise:
            raise HetflError(f"adaptive clipping needs dp_noise_multiplier below 2 sigma_b = {2 * count_noise:g} "
                             f"(Andrew et al. 2021, Thm. 1; sigma_b: --dp-clip-count-noise, default clients per round "
                             f"/ 20), got {z:g}; use fixed clipping (--dp-clip-quantile 0), more clients per round or "
                             f"a larger --dp-clip-count-noise")
    return DPSettings(noise_multiplier=z, delta=delta, clip=cfg.dp_clip, quantile=cfg.dp_clip_quantile,
                      clip_lr=cfg.dp_clip_lr, count_noise=count_noise, clients=cfg.num_clients, per_round=per_round,
                      rounds=cfg.rounds)


class PrivateAggregation:
    """A method's aggregation under DP-FedAvg (the module's docstring): noise on its masked sums, the clip norm kept
    and adapted, the epsilon spent."""

    def __init__(self, settings: DPSettings, seed: int):
        self.settings = settings
        self.seed = seed

    def clip_of(self, state: ServerState) -> float:
        """The clip norm of the coming round: the server state's (adaptive clipping), else the configured one."""
        clip = state.extra.get(CLIP_KEY)
        return self.settings.clip if clip is None else float(clip)

    def generator(self, round_index: int, secure: bool) -> torch.Generator:
        """The round's noise generator: seeded by (seed, round), or with ``secure`` by the operating system."""
        if secure:
            g = torch.Generator()
            g.manual_seed(secrets.randbits(63))
            return g
        return torch_generator(self.seed, "dp-noise", round_index)

    def aggregate(self, method, state: ServerState, updates: Iterable[Update], round_index: int,
                  secure: bool = False) -> tuple[ServerState, dict]:
        """``method``'s aggregation of ``updates`` with noise on its sums; returns the new state (holding the next
        round's clip norm) and the round's privacy record (``noised``). ``secure``: noise from the system's
        entropy."""
        bits: list[float] = []

        def watched() -> Iterator[Update]:
            for update in updates:
                bits.append(update.metrics.get(WITHIN_CLIP, 0.0))
                yield update

        return self.noised(method, state, lambda: method.aggregate(state, watched()), lambda: sum(bits), round_index,
                           secure)

    def aggregate_sums(self, method, state: ServerState, agg: MaskedMean, within: float, round_index: int
                       ) -> tuple[ServerState, dict]:
        """As ``aggregate``, from the sums alone (secure aggregation: ``MaskedMean.from_sums``) and ``within``, the
        summed bits of adaptive clipping; the noise is drawn from the system's entropy."""
        return self.noised(method, state, lambda: method.aggregate_mean(state, agg), lambda: within, round_index,
                           secure=True)

    def noised(self, method, state: ServerState, aggregate: Callable[[], ServerState], within: Callable[[], float],
               round_index: int, secure: bool) -> tuple[ServerState, dict]:
        """``aggregate()`` run with noise on every masked sum it makes (``Method.perturb``), then adaptive clipping's
        step from ``within()``, the summed bits. The record: epsilon spent so far, delta, the clip norm and the noise
        std on the sums, each evaluated level's mean noise std per coordinate after the division by the counts,
        and with adaptive clipping the noised fraction of updates within the clip."""
        s, clip = self.settings, self.clip_of(state)
        std = s.update_noise * clip
        generator = self.generator(round_index, secure)
        divided: dict[str, list[float]] = {}

        def perturb(agg: MaskedMean, levels: bool) -> None:
            for total in agg.sums.values():
                if total.is_floating_point():
                    total.add_(torch.randn(total.shape, generator=generator, dtype=total.dtype).to(total.device),
                               alpha=std)
            for label, value in (level_noise(method, agg, std) if levels else {}).items():
                divided.setdefault(label, []).append(value)

        method.noise = perturb
        try:
            new = aggregate()
        finally:
            method.noise = None
        record = {"epsilon": s.epsilon(round_index), "delta": s.delta, "clip": clip, "noise_std": std,
                  "noise_per_coordinate": {label: sum(v) / len(v) for label, v in divided.items()}}
        next_clip = clip
        if s.adaptive:  # Andrew et al. 2021, Alg. 1: the bits' sum noised, then C moves geometrically
            noisy = within() + s.count_noise * float(torch.randn((), generator=generator, dtype=torch.float64))
            record["within_clip"] = noisy / s.per_round
            next_clip = clip * math.exp(-s.clip_lr * (record["within_clip"] - s.quantile))
        extra = {**new.extra, CLIP_KEY: torch.tensor(next_clip, dtype=torch.float64)}
        return ServerState(new.params, new.opt, extra), record


def level_noise(method, agg: MaskedMean, std: float) -> dict[str, float]:
    """Per evaluated model of ``method`` (its global names: the masked sums of ``Method.aggregate``, not the per-level
    groups of InclusiveFL's): the mean, over its coordinates that some client held this round, of the noise std left
    after the division by the counts, std / count."""
    out = {}
    for label, spec in method.eval_specs().items():
        shapes = {n: s for n, s in method.models.shapes(spec).items() if spec.global_name(n) in agg.weights}
        counts = [c[c > 0].double() for c in extract(agg.weights, shapes, spec).values()]
        held = torch.cat(counts) if counts else torch.zeros(0)
        if len(held):
            out[label] = float((std / held).mean())
    return out
