"""Element-wise masked aggregation and server optimizers on masks (DESIGN.md, "Slicing").

Updates are folded into running sums as they arrive (FedJAX style), so the server holds one
global-shaped sum and one weight buffer, never one model per client. Every element is averaged
over the clients that held it; an element no client held keeps its value. Server optimizer
state (FedAdam moments, FedDyn's h) is global-shaped and only held elements move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .slicing import ROOT, State, SubModel, add_at


class MaskedMean:
    """Running element-wise weighted mean of local tensors placed at their window of global ones (``slicing.window``:
    the leading corner unless the spec rolls it)."""

    def __init__(self, global_state: State):
        self._ref = global_state
        self.sums: State = {}
        self.weights: State = {}
        self.num_updates = 0

    def add(self, local_state: State, weight: float, spec: SubModel = ROOT,
            rows: dict[str, torch.Tensor] | None = None) -> None:
        """Fold one client's tensors (local shape) with ``weight`` into the sums of their global names; ``rows``: for
        some local names, a boolean vector over the tensor's first dimension, the only rows of it that count (label
        masking's classifier rows, ``methods.options.LabelMask``); the others count whole."""
        for name, tensor in local_state.items():
            key = spec.global_name(name)
            ref = self._ref[key]
            if key not in self.sums:
                self.sums[key] = torch.zeros_like(ref)
                self.weights[key] = torch.zeros_like(ref)
            idx = spec.window(name, ref.shape, tensor.shape, ref.device)  # its chunks' windows too (dense layers)
            held = None if rows is None else rows.get(name)
            if held is None:
                add_at(self.sums[key], idx, tensor, alpha=weight)
                add_at(self.weights[key], idx, weight)
            else:
                held = held.to(tensor.device, tensor.dtype).view(-1, *[1] * (tensor.dim() - 1)).expand_as(tensor)
                add_at(self.sums[key], idx, tensor * held, alpha=weight)
                add_at(self.weights[key], idx, held, alpha=weight)
        self.num_updates += 1

    @classmethod
    def from_sums(cls, global_state: State, deltas: State, counts: State, num_updates: int) -> MaskedMean:
        """The running mean whose updates summed to ``deltas`` (each update minus the global tensors it was cut from,
        in global shape, 0 where it held nothing) over ``counts`` (the weight that held each element): what secure
        aggregation gives the server instead of the updates themselves."""
        agg = cls(global_state)
        for key, delta in deltas.items():
            count = counts[key].to(delta.dtype)
            agg.sums[key] = delta + count * global_state[key]
            agg.weights[key] = count
        agg.num_updates = num_updates
        return agg

    def mean(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per touched name: (mean where held, else 0) and the boolean mask of held elements."""
        out = {}
        for key, s in self.sums.items():
            w = self.weights[key]
            mask = w > 0
            out[key] = (torch.where(mask, s / w.clamp_min(1e-12), torch.zeros_like(s)), mask)
        return out


@dataclass
class ServerState:
    """Everything the server carries between rounds (DESIGN.md, "Data flow"); a checkpoint saves it whole.

    ``params``: the global tensors; ``opt``: the server optimizer's global-shaped state (FedAdam's
    moments, FedDyn's h) by key; ``extra``: a method's own state (InclusiveFL's momentum).
    """

    params: State
    opt: State = field(default_factory=dict)
    extra: State = field(default_factory=dict)

    def to(self, device) -> ServerState:
        """A copy with every tensor on ``device``."""
        move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        return ServerState(move(self.params), move(self.opt), move(self.extra))

    def to_dict(self) -> dict[str, State]:
        """The three parts as plain dicts of CPU tensors (what a checkpoint stores)."""
        cpu = self.to("cpu")
        return {"params": cpu.params, "opt": cpu.opt, "extra": cpu.extra}

    @classmethod
    def from_dict(cls, d: dict[str, State]) -> ServerState:
        """The state stored by ``to_dict``."""
        return cls(dict(d["params"]), dict(d.get("opt", {})), dict(d.get("extra", {})))


class ServerOptimizer:
    """A server optimizer on masks: hyper-parameters only; its state travels in ``ServerState.opt``."""

    def apply(self, state: State, key: str, x: torch.Tensor, mean: torch.Tensor, mask: torch.Tensor,
              count: torch.Tensor) -> torch.Tensor:
        """The new value of tensor ``key`` (``count``: weight that held each element); updates ``state`` in place."""
        raise NotImplementedError

    def step(self, server: ServerState, agg: MaskedMean) -> ServerState:
        """The new server state: every touched tensor moved by ``apply``, the others kept."""
        params, opt = dict(server.params), dict(server.opt)
        for key, (mean, mask) in agg.mean().items():
            params[key] = self.apply(opt, key, server.params[key], mean, mask, agg.weights[key])
        return ServerState(params, opt, server.extra)


@dataclass
class FedAvgServer(ServerOptimizer):
    """x <- x + lr * (mean - x) on held elements; lr = 1 is plain FedAvg (McMahan et al., 2017)."""

    lr: float = 1.0

    def apply(self, state, key, x, mean, mask, count):
        return torch.where(mask, x + self.lr * (mean - x), x)


@dataclass
class FedAdamServer(ServerOptimizer):
    """FedAdam (Reddi et al., 2021, Alg. 2): Adam on the pseudo-gradient mean - x, no bias correction.

    m <- b1 m + (1 - b1) D;  v <- b2 v + (1 - b2) D^2;  x <- x + lr m / (sqrt(v) + tau),
    applied only on elements some client held this round (the others keep x, m and v).
    """

    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def apply(self, state, key, x, mean, mask, count):
        delta = mean - x
        m = state.get("m/" + key, torch.zeros_like(x))
        v = state.get("v/" + key, torch.zeros_like(x))
        m = torch.where(mask, self.beta1 * m + (1 - self.beta1) * delta, m)
        v = torch.where(mask, self.beta2 * v + (1 - self.beta2) * delta * delta, v)
        state["m/" + key], state["v/" + key] = m, v
        return torch.where(mask, x + self.lr * m / (v.sqrt() + self.tau), x)


@dataclass
class FedDynServer(ServerOptimizer):
    """FedDyn's server (Acar et al., 2021, Alg. 1) on masks, as DepthFL's Alg. 1 applies it per block.

    Per element held by n of the N clients of the federation this round (unweighted mean over
    those n): h <- h - alpha * n / N * (mean - x);  x <- mean - h / alpha. Unheld elements keep x
    and h. DepthFL's Alg. 1 writes alpha/m_k without defining m_k; N is the number of clients in
    the federation, as in FedDyn and the DepthFL authors' code. Needs uniform aggregation weights,
    so ``MaskedMean`` weights are the counts n.
    """

    alpha: float = 0.1
    num_clients: int = 1

    def apply(self, state, key, x, mean, mask, count):
        h = state.get("h/" + key, torch.zeros_like(x))
        h = h - self.alpha * (count / self.num_clients) * (mean - x)
        state["h/" + key] = h
        return torch.where(mask, mean - h / self.alpha, x)


SERVER_OPTIMIZERS = ("fedavg", "fedadam", "feddyn")


DEFAULT_SERVER_LR = {"fedavg": 1.0, "fedadam": 1e-2}


def make_server_optimizer(name: str, *, lr: float, beta1: float, beta2: float, tau: float,
                          feddyn_alpha: float, num_clients: int):
    """The server optimizer called ``name`` with its hyper-parameters (``lr`` 0: its usual learning rate)."""
    if name == "fedavg":
        return FedAvgServer(lr=lr or DEFAULT_SERVER_LR[name])
    if name == "fedadam":
        return FedAdamServer(lr=lr or DEFAULT_SERVER_LR[name], beta1=beta1, beta2=beta2, tau=tau)
    if name == "feddyn":
        return FedDynServer(alpha=feddyn_alpha, num_clients=num_clients)
    raise ValueError(name)
