"""Secure aggregation on Flower: every round is Flower's SecAgg+ protocol, so the server learns only the sum of the
round's updates (``hetfl deploy --secure-aggregation``; docs/deployment.md, "Secure aggregation").

How a round flows (``SecureFlowerExecutor.aggregate_securely``, called by ``sim.Simulation.run_secure_round``):

1. The server plans the round as always (``Simulation.jobs``: each sampled client's task and local tensors) and
   fixes the round's vector ``Layout``: every global tensor in the global state's order, then a coverage mask for
   the tensors whose coverage the server cannot know (label masking's classifier rows; every tensor when a client
   may return part of what it got: FeDepth's blockwise trainer), then differential privacy's adaptive-clipping bit
   and the training loss (``secure_vector``). Every client's vector has this length and order: SecAgg+ sums
   vectors elementwise.
2. Flower's ``SecAggPlusWorkflow`` runs its four stages (setup, share keys, collect masked vectors, unmask) through
   ``StageGrid`` (hetfl's fast poll, ``grid.exchange``, instead of Flower's 3 s one); its strategy
   (``SumStrategy``) hands each client its work as a legacy ``FitIns`` (``secure_wire.fitins_of``).
3. A node trains its task exactly as in a plain deployment (``node.NodeTrainer``, on its warm worker), checks its
   update (``updates.check_update``: what the server can no longer check) and sends ``client_vector``: its update
   minus the tensors it received, placed at its window of the global shapes (0 elsewhere), the masks, its bit and
   loss. ``secaggplus_mod`` clips it to +-clipping_range, quantizes it stochastically, masks it and uploads it.
4. The server gets the survivors' mean vector (weight 1 each), multiplies it by their number and splits it into
   ``SecureSums``: the summed deltas, the counts (from the masks, or from the windows of the tensors each survivor
   was sent: public), the bits and the mean loss. ``Simulation.run_secure_round`` runs the method's server step
   on ``MaskedMean.from_sums`` (with differential privacy's noise first). The survivors' nodes keep their new own
   state (FedDyn's g_k): their updates are in the sum.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.server import ServerConfig
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

from ..errors import HetflError, warn
from ..executors import Job, SecureSums
from ..privacy.clipping import WITHIN_CLIP
from ..rundir import atomic_write_text
from ..slicing import State, add_at
from ..task import Task
from ..updates import Update, check_update
from .deployment import NO_REPLY, FlowerExecutor
from .grid import exchange
from .secure_vector import Layout
from .secure_wire import LAYOUT, MODULUS, ROWS, content_bytes, fitins_of, stage_of, unpack_masked
from .wire import work_content

MIN_CLIENTS = 3  # SecAgg+ needs more than 2 shares; and the sum of two updates tells each the other's
FULL_GRAPH = 25  # up to this many clients a round every client shares its keys with every other (SecAgg proper)
SETTINGS_FILE = "secure-aggregation.json"  # in RUN_DIR/flower: a secure run stays secure when it is resumed


# ---- settings -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecureSettings:
    """What a secure deployment sets; the rest of SecAgg+'s parameters follow from the clients per round
    (``protocol``)."""

    clipping_range: float = 8.0  # each entry of a client's vector must lie in [-c, c] (else the client refuses)

    def protocol(self, clients: int) -> dict:
        """``SecAggPlusWorkflow``'s parameters for a round of ``clients`` clients (at least ``MIN_CLIENTS``):

        * num_shares k: every client (SecAgg's complete graph) up to ``FULL_GRAPH`` clients, then an odd
          k >= 5 log2(n) (SecAgg+'s sparse graph of Bell et al. 2020: O(log n) neighbours);
        * reconstruction_threshold t: a majority of the k shares, k // 2 + 1 (at most k - t neighbours of a
          client may drop out and the round still unmasks; fewer than t colluding neighbours learn nothing);
        * quantization_range Q: the largest power of two with n Q < 2^32 (the modulus: n clients' quantized
          entries, each <= Q, must not wrap), at most 2^30 (Flower rounds in int32): a quantum of 2c / Q;
        * max_weight 1: every client's weight is 1 (num_examples = 1), so the workflow's weighted mean is the mean.
        """
        n = clients
        k = n if n <= FULL_GRAPH else min(n, 2 * math.ceil(5 * math.log2(n) / 2) + 1)
        q = 1 << min(30, 32 - math.ceil(math.log2(n + 1)))
        return {"num_shares": k, "reconstruction_threshold": k // 2 + 1, "clipping_range": float(self.clipping_range),
                "quantization_range": q, "modulus_range": MODULUS, "max_weight": 1.0}

    def quantum(self, clients: int) -> float:
        """The quantization step of one entry of one client's vector in a round of ``clients`` clients."""
        return 2 * self.clipping_range / self.protocol(clients)["quantization_range"]


def check_secure(sim, settings: SecureSettings) -> None:
    """Returns None; HetflError saying why ``sim``'s experiment cannot run with secure aggregation."""
    cfg, method = sim.cfg, sim.method
    if (refusal := method.secure_refusal) is not None:
        raise HetflError(f"--secure-aggregation: {cfg.method} cannot have it: {refusal}")
    if cfg.clients_per_round < MIN_CLIENTS:
        raise HetflError(f"--secure-aggregation needs at least {MIN_CLIENTS} clients per round (SecAgg+ splits "
                         f"each client's keys in more than 2 shares, and the sum of two updates tells each client the "
                         f"other's), got {cfg.clients_per_round}; raise --client-fraction or --num-clients")
    if cfg.dropout_fraction or cfg.corrupt_fraction:
        raise HetflError("--secure-aggregation: the simulator's injected faults (dropout_fraction, corrupt_fraction) "
                         "act on single updates, which the server no longer sees; set them to 0 (a node can still "
                         "fail for real, or corrupt its update with --node-config 'K:corrupt=nan')")
    if not (math.isfinite(settings.clipping_range) and settings.clipping_range > 0):
        raise HetflError(f"--secure-clipping-range must be a number > 0, got {settings.clipping_range:g}")
    if (bad := [k for k, v in sim.state.params.items() if not v.is_floating_point()]):
        raise HetflError(f"--secure-aggregation sums floating-point tensors only; {bad[0]} is "
                         f"{sim.state.params[bad[0]].dtype}")
    if settings.protocol(cfg.clients_per_round)["quantization_range"] < 1 << 16:
        raise HetflError(f"--secure-aggregation: {cfg.clients_per_round} clients per round leave SecAgg+'s 2^32 "
                         "modulus too few quantization levels; sample fewer clients per round")


def write_settings(run_dir: Path, settings: SecureSettings) -> None:
    """Returns None; records in ``run_dir`` that its run aggregates securely, and how (``read_settings``)."""
    path = Path(run_dir) / "flower" / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(settings)) + "\n")


def read_settings(run_dir: Path) -> SecureSettings | None:
    """The secure aggregation ``run_dir``'s run was started with, or None (a plain run)."""
    path = Path(run_dir) / "flower" / SETTINGS_FILE
    if not path.exists():
        return None
    try:
        return SecureSettings(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise HetflError(f"{path} cannot be read: {e}") from None


def coverage(jobs, global_state: State, names) -> State:
    """How many of ``jobs``' clients hold each element of the global tensors in ``names``: the windows of the
    tensors each was sent (public: the server cut them), for the tensors every client returns whole."""
    counts: State = {}
    names = set(names)
    for job in jobs:
        spec = job.task.spec
        for name, tensor in job.local.items():
            key = spec.global_name(name)
            if key not in names:
                continue
            ref = global_state[key]
            if key not in counts:
                counts[key] = torch.zeros(ref.shape, dtype=torch.float64)
            add_at(counts[key], spec.window(name, ref.shape, tensor.shape), 1.0)
    return counts


# ---- the server ----------------------------------------------------------------------------------------------
class SumStrategy(Strategy):
    """The legacy strategy ``SecAggPlusWorkflow`` drives: each client's own FitIns out (``configure_fit``), the
    survivors and their mean vector in (``aggregate_fit``); nothing else."""

    def __init__(self, grid, fitins: dict):
        self.grid, self.fitins = grid, fitins  # node id -> FitIns
        self.survivors: list[int] | None = None
        self.mean: np.ndarray | None = None

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(GridClientProxy(node, self.grid, 0), fitins) for node, fitins in self.fitins.items()]

    def aggregate_fit(self, server_round, results, failures):
        self.survivors = [proxy.node_id for proxy, _ in results]
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)[0]
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class SecAggPlus(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow`` with one repair: a client that drops out before its key shares went out
    (stages 'setup' and 'share keys') is no longer counted as a dropout to unmask. In flwr 1.41 it stays among
    ``sampled_node_ids``, so the 'unmask' stage lists it as dead, every client's ``_unmask`` looks up key shares it
    never received (KeyError) and the round fails; and were it unmasked, the server would remove pairwise masks that
    no survivor added. No survivor masked with it (a client masks only with the neighbours whose shares it got), so
    after 'share keys' it leaves the sampled set and every neighbourhood."""

    def share_keys_stage(self, grid, context, state) -> bool:
        ok = super().share_keys_stage(grid, context, state)
        shared = set(state.active_node_ids)
        state.sampled_node_ids = shared
        state.nid_to_neighbours = {nid: neighbours & shared for nid, neighbours in state.nid_to_neighbours.items()
                                   if nid in shared}
        return ok and self._check_threshold(state)


class StageGrid:
    """The Grid as ``SecAggPlusWorkflow`` sees it: ``send_and_receive`` pulls every ``grid.POLL_SECONDS`` (Flower's
    own waits 3 s between pulls, and a round has four stages), gives each message a time to live of the stage's
    timeout (a node's worker stops when it expires), widens the uint32 masked vectors back (``secure_wire``), and
    counts the bytes each way and the nodes that failed each stage, with Flower's reason."""

    def __init__(self, grid, timeout: float):
        self.grid, self.timeout = grid, timeout
        self.bytes_down = self.bytes_up = 0
        self.failed: dict[str, dict[int, str]] = {}  # stage -> node -> why it failed (not: no reply)
        self.seconds: dict[str, float] = {}  # stage -> wall seconds until its last reply

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        messages = list(messages)
        timeout = self.timeout if timeout is None else timeout
        stage = stage_of(messages[0]) if messages else None
        for message in messages:
            message.metadata.ttl = timeout
            self.bytes_down += content_bytes(message.content)
        started = time.perf_counter()
        replies = list(exchange(self.grid, dict(enumerate(messages)), timeout).values())
        self.seconds[str(stage)] = time.perf_counter() - started
        for reply in replies:
            if reply.has_error():
                if reply.error.code not in NO_REPLY:
                    self.failed.setdefault(stage, {})[reply.metadata.src_node_id] = reply.error.reason
                continue
            self.bytes_up += content_bytes(reply.content)
            unpack_masked(reply.content)
        return replies


class SecureFlowerExecutor(FlowerExecutor):
    """``FlowerExecutor`` whose rounds are SecAgg+ rounds: the server gets the sums of the updates alone
    (``aggregate_securely``)."""

    name = "flower-secagg"
    secure = True

    def __init__(self, sim, grid, settings: SecureSettings):
        super().__init__(sim, grid)
        check_secure(sim, settings)
        self.settings = settings

    def prepare(self) -> None:
        """Returns None; records the settings in the run folder (a resume stays secure), then waits for the nodes."""
        if self.sim.run_dir is not None and read_settings(self.sim.run_dir) is None:
            write_settings(self.sim.run_dir, self.settings)
        super().prepare()

    def execute(self, jobs, round_index: int):
        """Never: the server of a secure run sees no single update (``aggregate_securely``)."""
        raise HetflError("a secure executor hands out no single update; the round must aggregate securely")

    def rows(self, job: Job) -> list[str]:
        """The local names whose classifier rows count only for the classes the client holds (label masking,
        without differential privacy: ``Method.held_rows``), asked with a probe update that holds one class."""
        if self.method.privacy is not None or not job.task.train.label_mask or job.task.family.num_classes < 2:
            return []
        held = self.method.held_rows(Update(job.client, job.task.spec, job.local, 1, {}, (0,)))
        return sorted(held) if held else []

    def layout(self, jobs: list[Job], rows: dict[int, list[str]]) -> Layout:
        """The round's layout: masks for every tensor when a client may return part of what it got (a trainer
        other than sgd), else for the label-masked classifier tensors."""
        params = self.sim.state.params
        if any(job.task.trainer != "sgd" for job in jobs):
            masked = set(params)
        else:
            masked = {job.task.spec.global_name(n) for job in jobs for n in rows[job.client]}
        return Layout.of(params, masked, self.settings.clipping_range)

    def aggregate_securely(self, jobs: list[Job], round_index: int) -> SecureSums:
        """The sums of the round's updates by SecAgg+ over the jobs' nodes (the module's docstring)."""
        self.discover()
        jobs = list(jobs)
        placed = [job for job in jobs if job.client in self.nodes]
        if len(placed) < MIN_CLIENTS:
            if jobs:
                warn(f"round {round_index}: only {len(placed)} of the {len(jobs)} sampled clients have a SuperNode; "
                     f"SecAgg+ needs {MIN_CLIENTS}, so the round aggregates nothing")
            return SecureSums({}, {}, 0, missing=sorted(job.client for job in jobs))
        rows = {job.client: self.rows(job) for job in placed}
        layout = self.layout(placed, rows)
        node_of = {job.client: self.nodes[job.client] for job in placed}
        fitins = {}
        for job in placed:
            content = work_content(self.work(job))
            content["config"][LAYOUT] = layout.to_json()
            content["config"][ROWS] = json.dumps(rows[job.client])
            fitins[node_of[job.client]] = fitins_of(content)
        grid = StageGrid(self.grid, self.cfg.round_timeout)
        strategy = SumStrategy(grid, fitins)
        context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                                config=ServerConfig(num_rounds=1), strategy=strategy)
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round_index})
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()  # each client's tensors are in its FitIns
        workflow = SecAggPlus(**self.settings.protocol(len(placed)), timeout=self.cfg.round_timeout)
        failure = None
        try:
            workflow(grid, context)
        except Exception as e:  # noqa: BLE001 -- a reply Flower's workflow cannot read: the round sums nothing
            failure = f"{type(e).__name__}: {e}"
            strategy.survivors, strategy.mean = None, None
        print(f"secure aggregation, round {round_index}: SecAgg+ stages "  # the ServerApp's log (deploy --verbose)
              + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in grid.seconds.items()), flush=True)
        job_of = {node_of[job.client]: job for job in placed}
        kept = sorted((job_of[n] for n in strategy.survivors or [] if n in job_of), key=lambda job: job.client)
        for stage, nodes in grid.failed.items():
            for node, reason in nodes.items():
                if node in job_of:
                    warn(f"round {round_index}: client {job_of[node].client} failed SecAgg+'s stage '{stage}': "
                         f"{reason.strip().splitlines()[-1] if reason.strip() else reason}")
        if failure is not None:
            warn(f"round {round_index}: secure aggregation failed ({failure}); nothing aggregated")
        elif strategy.survivors is None:
            warn(f"round {round_index}: SecAgg+ halted (fewer clients than its reconstruction threshold answered a "
                 "stage); nothing aggregated")
        missing = sorted({job.client for job in jobs} - {job.client for job in kept})
        sums = SecureSums({}, {}, 0, missing=missing, wire_bytes_down=grid.bytes_down, wire_bytes_up=grid.bytes_up)
        if not kept or strategy.mean is None:
            return sums
        if self.method.stateful_clients:  # every update in the sum is aggregated: its node's new own state counts
            for job in kept:
                self.state_rounds[job.client] = round_index
        deltas, masks, within, loss = layout.unflatten(strategy.mean * len(kept))
        params = self.sim.state.params
        counts = coverage(kept, params, [k for k, _ in layout.names if k not in set(layout.masked)])
        counts.update({k: torch.round(m) for k, m in masks.items()})  # integers: zeros and ones quantize exactly
        for key, _ in layout.names:  # every name, as the vector holds them all (bytes up: the global model's)
            ref = params[key]
            count = counts.get(key, torch.zeros(ref.shape, dtype=torch.float64))
            held = count > 0
            sums.counts[key] = count.to(ref.device, ref.dtype)
            sums.deltas[key] = torch.where(held, deltas[key], torch.zeros_like(deltas[key])).to(ref.device, ref.dtype)
        sums.clients, sums.within, sums.train_loss = len(kept), float(round(within)), loss / len(kept)
        return sums


def settings_from_run_config(run_config: dict) -> SecureSettings | None:
    """The secure aggregation a ServerApp's run config asks for (``secure-aggregation = true``), or None."""
    value = run_config.get("secure-aggregation", False)
    if isinstance(value, str):
        value = value.strip().lower() in ("1", "true", "yes", "on")
    if not value:
        return None
    return SecureSettings(clipping_range=float(run_config.get("secure-clipping-range", SecureSettings.clipping_range)))


__all__ = ["SecureFlowerExecutor", "SecureSettings", "check_secure", "coverage", "read_settings",
           "settings_from_run_config", "write_settings"]
