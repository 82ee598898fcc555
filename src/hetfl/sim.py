"""The embedded simulator: rounds of sample -> plan -> extract -> client update -> aggregate -> evaluate.

Every input error is raised (as HetflError) while the experiment is being set up, before the
run folder exists; a run folder therefore always belongs to a run that started. The round loop
streams client updates into the method's aggregation, so server memory is one global model plus
one running sum whatever the number of clients.

A round is engine-neutral except for one part: the executor (``executors``) takes the round's
jobs (client, task, local tensors) and returns each client's reply, in job order: in this process
one client after another (``sequential``) or stacked (``batched``), or over the network
(``flower.deployment``). The round loop composes it with everything else: sampling, planning, the
checks on replies, aggregation, evaluation, checkpoints and resume. No engine subclasses it.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
from tqdm import tqdm

from . import __version__
from .checkpoint import WHERE_IT_RUNS, ClientStateStore, checked_payload, load_checkpoint, save_checkpoint
from .aggregation import MaskedMean, ServerState
from .config import Config
from .data import load_dataset, split_train_test
from .data.partition import partition_among
from .data.server import server_data
from .devices import Budget, Scenario
from .distributed import Team, checksum
from .errors import HetflError, release_warnings, spans, warn
from .evaluate import batch_tally, exit_numbers, static_batchnorm, tally_scores, truncations
from .executors import Executor, Job, LocalClients
from .executors.batched import BatchedExecutor
from .executors.distributed import DistributedExecutor, MemoryStore
from .executors.faults import FaultInjection
from .executors.sequential import SequentialExecutor
from .machine import describe
from .methods import build_method, config_from, load_config, method_class
from .models.cache import ModelCache
from .models.frozen_features import features_of, serving
from .models.registry import token_input
from .report import headline_accuracy, rounds_to_target
from .rundir import (append_jsonl, atomic_torch_save, atomic_write_json, check_rounds, create_run_dir, crash_point,
                     lock_run_dir, read_jsonl, readable_json_file, readable_torch_file, remove_temporary_files,
                     remove_tree, unlock_run_dir, warn_partial_line, write_jsonl)
from .seeding import rng_for, torch_generator
from .slicing import SubModel, extract, state_bytes
from .updates import check_update, warn_dropped


@dataclass
class RoundLog:
    """What one round did: participants, loss, traffic, time, and evaluation when it ran."""

    round: int
    lr: float
    clients: int = 0
    train_loss: float | None = None  # None when no client took part
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0  # the whole round's, its evaluation's included
    eval_seconds: float = 0.0  # the evaluation's part of them (0 in a round that does not evaluate)
    eval: dict = field(default_factory=dict)
    local_accuracy: float | None = None  # mean over clients of their level model on their own test split
    dropped: int = 0  # updates rejected before aggregation (len(rejected))
    rejected: dict[str, str] = field(default_factory=dict)  # client -> why its update was rejected
    missing: list[int] = field(default_factory=list)  # clients given a task that sent no reply (dropout, deadline)
    wire_bytes_down: int | None = None  # bytes of the tensors' serialised form sent and received (None: no wire)
    wire_bytes_up: int | None = None
    # clients whose trainer measures its steps (blockwise): client -> the largest step's bytes, the budget, their ratio
    memory: dict[str, dict] | None = None
    server: dict | None = None  # what the server did beyond averaging (Method.server_log; FedDF: its distillation)
    # differential privacy: epsilon spent so far, delta, clip norm, noise (privacy.mechanism.PrivateAggregation)
    privacy: dict | None = None


def device_named(name: str) -> torch.device:
    """The torch device called ``name``, whether or not this machine has it; HetflError for a name torch refuses."""
    try:
        return torch.device(name)
    except RuntimeError:
        raise HetflError(f"device '{name}' is not a torch device; use cpu, cuda or cuda:N") from None


def resolve_device(name: str) -> torch.device:
    """The torch device called ``name``; an error if it is not available here."""
    device = device_named(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HetflError(f"device '{name}' asked for but CUDA is not available on this machine; use --device cpu")
    return device


ExecutorFactory = Callable[["Simulation"], Executor]


class Simulation:
    """One experiment: set up (validating everything), then ``run``.

    ``executor(sim)`` makes the executor of the set-up experiment (default: the config's
    ``executor`` in this process); ``on_round(sim, record)`` is called after every round is logged
    and checkpointed (an engine's progress lines). ``team``: the processes sharing the run
    (``distributed``; default this one alone): every rank builds the same simulation, shares each
    round's clients and evaluation, and rank 0 alone writes the run folder.
    """

    def __init__(self, cfg: Config, executor: ExecutorFactory | None = None,
                 on_round: Callable[[Simulation, dict], None] | None = None, team: Team | None = None):
        self.cfg = cfg.validate()
        self.team = team or Team()
        self.device = self.team.device(resolve_device(cfg.device))
        dataset = load_dataset(cfg.dataset, cfg.data_dir or None, cfg.max_length)
        wanted = method_class(cfg.method).server_data_wanted(cfg)  # FedDF's distillation set, before the partition
        server = server_data(*wanted, dataset, cfg.seed, cfg.data_dir or None, cfg.max_length) if wanted else None
        held = server.client_indices if server else None  # a holdout no client may hold
        self.holdout = len(dataset.y_train) - len(held) if held is not None else 0
        parts = partition_among(dataset.y_train, held, cfg.num_clients, cfg.partition, alpha=cfg.alpha,
                                classes_per_client=cfg.classes_per_client, min_size=cfg.min_client_size, seed=cfg.seed)
        self.client_test_parts = None
        if cfg.client_test_fraction > 0:
            parts, test_parts = split_train_test(parts, cfg.client_test_fraction, cfg.seed)
            self.client_test_parts = [p.to(self.device) for p in test_parts]
        self.scenario = Scenario(cfg.scenario, cfg.num_clients, cfg.level_proportions, cfg.seed)
        self.method = build_method(cfg, dataset.input_shape, dataset.num_classes, self.device, who=self._who)
        if self.method.level_budgets is not None:  # devices carry physical budgets; methods fit into them
            self.scenario.use_budgets(self.method.level_budgets)
        if server is not None:
            self.method.receive_server_data(server.x.to(self.device))
        self.eval_models = ModelCache(self.method.family, self.device)  # no training-only hooks (Scaler)
        self.dataset = dataset
        self.x_train, self.y_train = dataset.x_train.to(self.device), dataset.y_train.to(self.device)
        self.x_test, self.y_test = dataset.x_test.to(self.device), dataset.y_test.to(self.device)
        self.x_bn = self.x_train  # what static BN computes its statistics on
        if cfg.static_bn_samples and cfg.static_bn_samples < len(self.x_train):
            subset = torch.randperm(len(self.x_train), generator=torch_generator(cfg.seed, "static-bn"))
            self.x_bn = self.x_train[subset[:cfg.static_bn_samples].to(self.device)]
        self.parts = [p.to(self.device) for p in parts]
        if self.team.size > 1:
            self.team.agree(self._facts())
        self._check_model_takes_data()
        # a frozen backbone's exit summaries of every document, computed once (models.frozen_features)
        self.frozen_features = features_of(self.x_train, self.x_test) if cfg.cache_frozen_features else None
        self.state: ServerState = self.method.init_state(cfg.seed)
        self.run_dir: Path | None = None  # created by the first ``run``, not before (no folder on bad input)
        self.start_round = 0
        self.history: list[dict] = []
        self.elapsed = 0.0
        self.segments: list[dict] = []  # the hardware of each stretch of rounds (run)
        self.on_round = on_round
        inner = executor(self) if executor else self.local_executor()
        faulty = cfg.dropout_fraction or cfg.corrupt_fraction
        self.executor = FaultInjection(inner, cfg.seed, cfg.dropout_fraction, cfg.corrupt_fraction,
                                       self.sample_clients) if faulty else inner

    def _check_model_takes_data(self) -> None:
        """Returns None; raises HetflError where the data and the model cannot train together, before the run
        folder exists: crops larger than the images, a batch of one sample under BatchNorm, inputs the backbone
        cannot read (too small for its pooling). Augmenting text is refused by ``Config.validate``."""
        cfg, x = self.cfg, self.x_train
        if self.method.family.example_input is not token_input and cfg.crop_padding > min(x.shape[2:]):
            raise HetflError(f"crop_padding {cfg.crop_padding} is beyond the {tuple(x.shape[2:])} images of "
                             f"{cfg.dataset}; use at most {min(x.shape[2:])}")
        spec = SubModel(depth=self.method.family.arch.num_blocks)
        model = self.eval_models.module(spec)
        alone = [k for k, part in enumerate(self.parts) if len(part) == 1]
        if (cfg.batch_size == 1 or alone) and not _trains_on_one_sample(model, x[:1]):
            who = "batch_size 1 gives" if cfg.batch_size == 1 else f"client {alone[0]} holds one sample, which gives"
            raise HetflError(f"{who} BatchNorm a batch of one sample, whose statistics are undefined where the "
                             f"features are 1x1 ({cfg.model} on {cfg.dataset}); use batch_size >= 2, clients of 2 or "
                             "more samples, or --norm none")
        try:
            with torch.no_grad():
                model.eval()(x[:2])
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise HetflError(f"model {cfg.model} cannot read {cfg.dataset}'s inputs of shape {tuple(x.shape[1:])}: "
                             f"{reason}") from None

    def _facts(self) -> dict[str, object]:
        """What every rank of a run must share: the experiment's options, the hetfl and torch versions, the kind of
        device and the data (a checksum of the dataset and the partition)."""
        machine_local = (*WHERE_IT_RUNS, "data_dir", "out")  # paths may differ between machines; the data may not
        facts = {f"option {k}": v for k, v in self.cfg.to_dict().items() if k not in machine_local}
        return {**facts, "hetfl version": __version__, "torch version": torch.__version__,
                "device type": self.device.type,
                "data": checksum(self.x_train, self.y_train, self.x_test, self.y_test, *self.parts)}

    def local_executor(self) -> Executor:
        """The config's in-process executor: batched on request or (auto) on CUDA, else sequential (on a CPU,
        stacking clients does not pay: ``hetfl bench throughput``); in a team of processes, it trains this rank's
        share of each round (``executors.distributed``)."""
        choice = self.cfg.executor
        if choice == "auto":
            choice = "batched" if self.device.type == "cuda" else "sequential"
        store = None
        if self.method.stateful_clients:  # rank 0 keeps the clients' state in the run folder, the others in memory
            memory = MemoryStore()
            store = (lambda: self.client_store) if self.team.owner else (lambda: memory)
        clients = LocalClients(self.x_train, self.y_train, self.parts, self.method.models, store)
        local = BatchedExecutor(clients) if choice == "batched" else SequentialExecutor(clients)
        return DistributedExecutor(local, clients, self.team, self.method.family) if self.team.size > 1 else local

    def _who(self, level: int) -> str:
        """The devices of a level, for errors: its first client in round 1, if any."""
        holders = (self.scenario.levels(1) == level).nonzero()[0]
        return f"client {int(holders[0])} (level {level})" if len(holders) else f"level {level}"

    # ---- run folder -----------------------------------------------------------------------
    def create_run_dir(self) -> Path:
        """A new run folder holding the resolved config, created whole and locked by this process."""
        cfg = self.cfg
        self.run_dir = create_run_dir(Path(cfg.out) / cfg.run_folder_name(datetime.now()),
                                      {"config.json": json.dumps(cfg.to_dict(), indent=2) + "\n"})
        return self.run_dir

    @classmethod
    def resume(cls, run_dir: str | Path, executor: ExecutorFactory | None = None,
               on_round: Callable[[Simulation, dict], None] | None = None, device: str | None = None,
               team: Team | None = None) -> Simulation:
        """The experiment of ``run_dir`` restored at its last checkpoint (``executor``, ``on_round``, ``team``: as for
        the constructor; the other ranks of a team call ``follow``). A folder holding only its config starts at
        round 1. ``device``: where it goes on (None: its config's). The device is no part of the experiment
        (``checkpoint.same_config``), so a run an accelerator began goes on on a CPU; ``segments`` says which
        hardware computed which rounds. A run goes on with any number of processes: the rounds do not depend on it."""
        run_dir = Path(run_dir)
        config_path = run_dir / "config.json"
        if not run_dir.is_dir() or not config_path.exists():
            raise HetflError(f"{run_dir} is not a hetfl run folder (no config.json)")
        lock_run_dir(run_dir)  # before anything is read: a live writer would change it underneath
        try:  # every check before the first change: a refused resume leaves the folder as it was
            cfg = load_config(config_path).validate()
            cfg = cfg if device is None else cfg.replace(device=device)
            payload = load_checkpoint(run_dir, cfg)
            history, partial = read_jsonl(run_dir / "metrics.jsonl")
            check_rounds(history, run_dir / "metrics.jsonl")
            if team is not None and team.size > 1:
                team.broadcast(cfg.to_dict())  # the other ranks' config (``follow``)
            sim = cls(cfg, executor, on_round, team)
            if payload is not None:
                checked_payload(payload, run_dir / "checkpoint" / "state.pt", cfg.rounds, sim.state.params)
        except BaseException:
            unlock_run_dir(run_dir)
            raise
        sim.run_dir = run_dir
        remove_temporary_files(run_dir)  # what a kill during an atomic write left
        if payload is None:  # killed before its first checkpoint: every round is seeded, so start again
            if history or partial:
                warn(f"{run_dir} has no checkpoint yet; resuming from round 1")
            remove_tree(sim.client_store.root)
        else:
            sim.state = ServerState.from_dict(payload["state"]).to(sim.device)
            sim.start_round = int(payload["round"])
            sim.elapsed = float(payload["elapsed"])
            sim.segments = list(payload.get("segments", []))  # older checkpoints have none
            sim.client_store.restore(payload["client_state_dir"])
            sim.executor.restore(payload)
        sim.history = [r for r in history if r["round"] <= sim.start_round]
        if lost := sim.metrics_lost_rounds():
            warn(f"{run_dir / 'metrics.jsonl'} lacks the records of rounds {spans(lost)} (the file was truncated or "
                 f"deleted); the run goes on after round {sim.start_round} from its checkpoint, and summary.json "
                 "lists those rounds as metrics_lost_rounds")
        elif partial:
            warn_partial_line(run_dir / "metrics.jsonl", f"resuming after round {sim.start_round}")
        if partial or len(sim.history) < len(history):  # a finished run's folder stays untouched
            write_jsonl(run_dir / "metrics.jsonl", sim.history)
        return sim

    @classmethod
    def follow(cls, team: Team, device: str | None = None) -> Simulation:
        """Rank r > 0's part of a resumed run: the config of rank 0's run folder (``resume``), on ``device`` (None: the
        config's); the state it goes on from arrives when the run starts (``run``)."""
        values = team.broadcast(None)
        cfg = config_from(values, source="rank 0's run folder", resolved=True).validate()
        return cls(cfg if device is None else cfg.replace(device=device), team=team)

    @property
    def global_state(self) -> dict[str, torch.Tensor]:
        """The global tensors (``state.params``)."""
        return self.state.params

    @property
    def client_store(self) -> ClientStateStore:
        """Per-client persistent state of this run (FedDyn's g_k), on disk."""
        return ClientStateStore(self.run_dir / "client_state")

    # ---- one round ---------------------------------------------------------------------
    def sample_clients(self, round_index: int) -> list[int]:
        """Clients sampled this round, sorted (seeded by seed and round)."""
        rng = rng_for(self.cfg.seed, "sample", round_index)
        return sorted(rng.choice(self.cfg.num_clients, self.cfg.clients_per_round, replace=False).tolist())

    def budget(self, client: int, round_index: int) -> Budget:
        """The budget of ``client`` at ``round_index``: the one it states (through the executor), else the
        scenario's."""
        return self.executor.budget(client, round_index) or self.scenario.budget(client, round_index)

    def jobs(self, round_index: int) -> Iterator[Job]:
        """The jobs of the sampled clients that take part this round, in client order, cut one at a time."""
        for client in self.sample_clients(round_index):
            planned = self.method.configure(self.state, client, self.budget(client, round_index), round_index)
            if planned is not None:
                yield Job(client, *planned)

    def run_round(self, round_index: int) -> RoundLog:
        """Train the sampled clients and aggregate the updates that pass the checks into the global state."""
        log = RoundLog(round=round_index, lr=self.cfg.lr_at(round_index))
        if self.executor.secure:
            return self.run_secure_round(log)
        losses = []

        if self.executor.wire:
            log.wire_bytes_down = log.wire_bytes_up = 0

        def updates():
            for job, reply in self.executor.execute(self.jobs(round_index), round_index):
                if self.executor.wire:
                    log.wire_bytes_down += reply.wire_bytes_down
                    log.wire_bytes_up += reply.wire_bytes_up
                if reply.update is None and reply.problem is None:
                    log.missing.append(job.client)
                    continue
                reason = reply.problem or check_update(reply.update, job.task, job.local)
                if reason is not None:  # one bad client must not poison the global model
                    log.dropped += 1
                    log.rejected[str(job.client)] = reason
                    warn_dropped(self.run_dir, job.client, round_index, reason)
                    continue
                if reply.keep:
                    reply.keep()
                log.clients += 1
                if "memory_bytes" in reply.update.metrics:
                    log.memory = log.memory or {}
                    log.memory[str(job.client)] = _memory_record(reply.update.metrics)
                log.bytes_down += state_bytes(job.local)
                log.bytes_up += state_bytes(reply.update.state)
                losses.append(reply.update.metrics["train_loss"])
                yield reply.update

        with serving(self.frozen_features):  # the clients train as aggregation draws their updates
            if self.method.privacy is not None:  # noise drawn from the system's entropy where updates cross a network
                self.state, log.privacy = self.method.privacy.aggregate(self.method, self.state, updates(), round_index,
                                                                        secure=self.executor.wire)
            else:
                self.state = self.method.aggregate(self.state, updates())
        log.server = self.method.server_log()
        log.train_loss = sum(losses) / len(losses) if losses else None
        return log

    def run_secure_round(self, log: RoundLog) -> RoundLog:
        """A round under secure aggregation: the executor hands back only the sums of the updates
        (``executors.SecureSums``), and the method's server step runs on their masked mean (noised first under
        differential privacy). No single update reaches the server, so none is checked here: each client checks
        its own before it masks it."""
        t, method = log.round, self.method
        jobs = list(self.jobs(t))
        sums = self.executor.aggregate_securely(jobs, t)
        log.clients, log.missing, log.train_loss = sums.clients, list(sums.missing), sums.train_loss
        log.wire_bytes_down, log.wire_bytes_up = sums.wire_bytes_down, sums.wire_bytes_up
        log.bytes_down = sum(state_bytes(job.local) for job in jobs)
        log.bytes_up = sums.clients * state_bytes(sums.deltas)  # each client's vector is the global model's size
        agg = MaskedMean.from_sums(self.state.params, sums.deltas, sums.counts, sums.clients)
        if method.privacy is not None:
            self.state, log.privacy = method.privacy.aggregate_sums(method, self.state, agg, sums.within, t)
        else:
            self.state = method.aggregate_mean(self.state, agg)
        log.server = method.server_log()
        return log

    @torch.no_grad()
    def evaluate(self, round_index: int | None = None, on_model: Callable[[str], None] | None = None
                 ) -> tuple[dict[str, dict[str, float]], float | None]:
        """Accuracy of every exit and the ensemble of each evaluation model of the method, and with client
        test splits the local accuracy at ``round_index`` (else None). ``on_model(step)`` hears which model is
        evaluated next ("global (1/4)"), for a progress bar.

        Local accuracy (ScaleFL Sec. 4) is the mean over clients of the accuracy of the model the
        client's level trains, on its own test split. Each sub-model is loaded, and its static BN
        statistics computed, once for both; a served model that is a truncation of another
        (``truncations``) is scored from the other's exit logits, which are its own.

        In a team of processes each rank takes its share of the statistics' chunks, of the test batches
        and of the clients; the parts are gathered and added in one process's order, so the scores are
        that process's, exactly.
        """
        labels: dict[SubModel, list[str]] = {}
        for label, spec in self.method.eval_specs().items():
            labels.setdefault(spec, []).append(label)
        clients: dict[SubModel, list[int]] = {}
        if self.client_test_parts is not None and round_index is not None:
            for client, test in enumerate(self.client_test_parts):
                spec = self.method.plan(client, self.budget(client, round_index), round_index)
                if spec is not None and len(test):
                    clients.setdefault(spec, []).append(client)
        states = {spec: extract(self.state.params, self.eval_models.shapes(spec), spec)
                  for spec in {**labels, **clients}}
        numbers = {spec: exit_numbers(self.eval_models.module(spec)) for spec in states}
        # a model is scored from another's test logits only where both are scored on the test set
        inside = truncations({s: states[s] for s in labels}, numbers, [s for s in labels if s not in clients])
        out, local, size, team = {}, {}, self.cfg.eval_batch_size, self.team
        batches = range(0, len(self.x_test), size)
        run = [spec for spec in states if spec not in inside]
        for i, spec in enumerate(run, start=1):
            if on_model:
                on_model(f"{'/'.join(labels.get(spec, ['local']))} ({i}/{len(run)})")
            model = self.eval_models.loaded(spec, states[spec])
            with self._statistics(model), serving(self.frozen_features):
                if spec in labels:
                    within = [(inner, positions) for inner, (outer, positions) in inside.items() if outer == spec]
                    tallies = {spec: [], **{inner: [] for inner, _ in within}}
                    for start in (batches[b] for b in team.share(len(batches))):
                        logits, target = model(self.x_test[start:start + size]), self.y_test[start:start + size]
                        tallies[spec].append(batch_tally(logits, target))
                        for inner, positions in within:  # scored from this model's logits, not run again
                            tallies[inner].append(batch_tally([logits[p] for p in positions], target))
                    parts = team.gather(tallies)
                    for scored in tallies:
                        result = tally_scores([t for part in parts for t in part[scored]], len(self.y_test),
                                              numbers[scored])
                        out.update({label: result for label in labels[scored]})
                held = clients.get(spec, [])
                for k in team.share(len(held)):
                    idx = self.client_test_parts[held[k]]
                    scores = self.method.predict(model(self.x_train[idx]))
                    local[(i, k)] = (scores.argmax(1) == self.y_train[idx]).double().mean().item()
        if team.size > 1:
            local = {key: acc for part in team.gather(local) for key, acc in part.items()}
        accuracies = [local[key] for key in sorted(local)]  # one process's order: by model, then client
        order = {label: i for i, label in enumerate(self.method.eval_specs())}
        out = dict(sorted(out.items(), key=lambda kv: order[kv[0]]))
        return out, (sum(accuracies) / len(accuracies) if accuracies else None)

    def _statistics(self, model):
        """Evaluation mode with static BatchNorm statistics of the training data (one rule for every method), each
        rank of a team computing its share of them."""
        return static_batchnorm(model, self.x_bn, team=self.team)

    # ---- the loop ---------------------------------------------------------------------
    def run(self, progress: bool = True, stop_after: int | None = None) -> dict:
        """Run the remaining rounds (up to ``stop_after``, for tests of resume); returns the summary.

        In a team of processes, rank 0 alone creates, writes and locks the run folder, shows progress and calls
        ``on_round``; every rank starts from rank 0's state (its checkpoint's, after a resume).
        """
        cfg, owner = self.cfg, self.team.owner
        if self.run_dir is None and owner:
            self.create_run_dir()
        release_warnings()  # set up: what it warned of is printed now, and what comes is printed as it comes
        finished = owner and self.start_round >= cfg.rounds and self.final_files_ok()
        if self.team.size > 1:
            finished = self._start_from_owner(finished)
        if finished:
            if owner:
                unlock_run_dir(self.run_dir)
            return self.summary()
        if self.start_round < cfg.rounds:
            self.executor.prepare()
            processes = {"processes": self.team.size} if self.team.size > 1 else {}
            self.segments.append({"from_round": self.start_round + 1, "elapsed_before": self.elapsed,
                                  **describe(self.device), **processes})  # machine.device_seconds splits the time
        if self.frozen_features is not None:  # its time is the run's (none where an earlier run filled it)
            started = time.perf_counter()
            self.frozen_features.prepare(self.eval_models.module(spec) for spec in self.method.eval_specs().values())
            self.elapsed += time.perf_counter() - started
        last_checkpoint = time.monotonic()
        progress = progress and owner
        bar = tqdm(range(self.start_round + 1, cfg.rounds + 1), initial=self.start_round, total=cfg.rounds,
                   desc=f"{cfg.method}", unit="round", disable=not progress, dynamic_ncols=True)
        def step(what: str) -> None:  # training and evaluating are the bar's steps: evaluation can take as long
            bar.set_description_str(f"{cfg.method}: {what}", refresh=progress)

        for t in bar:
            started = time.perf_counter()
            step(f"round {t}, training")
            log = self.run_round(t)
            crash_point("round-trained")  # every rank passes it (tests kill one rank of a team here)
            if t % cfg.eval_every == 0 or t == cfg.rounds:
                evaluating = time.perf_counter()
                log.eval, log.local_accuracy = self.evaluate(t, lambda model: step(f"round {t}, evaluating {model}"))
                log.eval_seconds = time.perf_counter() - evaluating
            bar.set_description_str(cfg.method, refresh=False)
            log.seconds = time.perf_counter() - started
            self.elapsed += log.seconds
            record = log.__dict__
            self.history.append(record)
            if owner:
                append_jsonl(self.run_dir / "metrics.jsonl", record)
                crash_point("round-logged")
                if self.checkpoint_due(t, time.monotonic() - last_checkpoint):
                    self.save_checkpoint(t)
                    last_checkpoint = time.monotonic()
            bar.set_postfix(_postfix(self.history, self.headline), refresh=False)
            if self.on_round and owner:
                self.on_round(self, record)
            if stop_after is not None and t >= stop_after:
                bar.close()
                return {}
        bar.close()
        summary = self.summary()
        if owner:  # the model first: a summary.json means the run is finished, for resume and the bench runner
            atomic_torch_save({k: v.cpu() for k, v in self.state.params.items()}, self.run_dir / "final_model.pt")
            atomic_write_json(self.run_dir / "summary.json", summary)
            unlock_run_dir(self.run_dir)
        return summary

    def _start_from_owner(self, finished: bool) -> bool:
        """Every rank takes rank 0's state, round and elapsed time (a resumed run's checkpoint); returns rank 0's
        ``finished`` (the run folder's final files are there: nothing left to do)."""
        sent = (self.state.to_dict(), self.start_round, self.elapsed, finished) if self.team.owner else None
        state, self.start_round, self.elapsed, finished = self.team.broadcast(sent)
        if not self.team.owner:
            self.state = ServerState.from_dict(state).to(self.device)
        return finished

    def checkpoint_due(self, round_index: int, since_last: float) -> bool:
        """Whether to checkpoint after ``round_index``: every ``checkpoint_every`` rounds, after round 1 and
        the last, and once ``checkpoint_seconds`` have passed since the last one (0 = no time limit)."""
        cfg = self.cfg
        return (round_index % cfg.checkpoint_every == 0 or round_index in (1, cfg.rounds)
                or 0 < cfg.checkpoint_seconds <= since_last)

    def final_files_ok(self) -> bool:
        """Whether the run folder holds a readable final_model.pt and summary.json."""
        run_dir = self.run_dir
        return readable_torch_file(run_dir / "final_model.pt") and readable_json_file(run_dir / "summary.json")

    def save_checkpoint(self, round_index: int) -> None:
        """Checkpoint the state after ``round_index``."""
        payload = {"config": self.cfg.to_dict(), "round": round_index, "elapsed": self.elapsed,
                   "segments": self.segments, "state": self.state.to_dict(), **self.executor.state()}
        save_checkpoint(self.run_dir, payload, self.client_store)
        self.executor.checkpointed()

    def headline(self, evaluation: dict) -> float:
        """The headline accuracy: the global model's ensemble or last exit, as the method infers."""
        return headline_accuracy(evaluation["global"], self.method.inference)

    def summary(self) -> dict:
        """Final evaluation, best headline accuracy, mean traffic per round and wall time."""
        evaluated = [r for r in self.history if r["eval"]]
        final = evaluated[-1]["eval"] if evaluated else {}
        curve = [(r["round"], self.headline(r["eval"])) for r in evaluated]
        n = max(len(self.history), 1)
        return {
            "method": self.cfg.method, "dataset": self.cfg.dataset, "seed": self.cfg.seed,
            "rounds": self.cfg.rounds, "final": final, "headline": self.method.inference,
            "accuracy": self.headline(final) if final else None,
            "best_accuracy": max((a for _, a in curve), default=None),
            "best_round": max(curve, key=lambda ta: ta[1])[0] if curve else None, "curve": curve,
            "local_accuracy": evaluated[-1].get("local_accuracy") if evaluated else None,
            "target_accuracy": self.cfg.target_accuracy,
            "rounds_to_target": rounds_to_target(curve, self.cfg.target_accuracy),
            **_memory_summary(self.history),
            "bytes_down_per_round": sum(r["bytes_down"] for r in self.history) / n,
            "bytes_up_per_round": sum(r["bytes_up"] for r in self.history) / n,
            "wall_seconds": self.elapsed, "device": self.cfg.device, "segments": self.segments,
            "executor": self.executor.name,
            "run_dir": str(self.run_dir),
            **({"metrics_lost_rounds": lost} if (lost := self.metrics_lost_rounds()) else {}),
            **({"privacy": self.privacy_summary()} if self.method.privacy is not None else {}),
        }

    def privacy_summary(self) -> dict:
        """What differential privacy spent: epsilon at delta after the rounds run, the mechanism and its accountant."""
        s = self.method.privacy.settings
        rounds = self.history[-1]["round"] if self.history else 0
        noise: dict[str, list[float]] = {}  # each evaluated model's noise std per coordinate, by round
        for record in self.history:
            for label, value in ((record.get("privacy") or {}).get("noise_per_coordinate") or {}).items():
                noise.setdefault(label, []).append(value)
        return {"epsilon": s.epsilon(rounds), "delta": s.delta, "noise_multiplier": s.noise_multiplier,
                "noise_per_coordinate": {label: sum(v) / len(v) for label, v in noise.items()},
                "target_epsilon": self.cfg.dp_target_epsilon or None,
                "clipping": f"adaptive, quantile {s.quantile:g}" if s.adaptive else f"fixed at {s.clip:g}",
                "accountant": "RDP (dp-accounting), a fixed number of clients per round sampled without replacement, "
                              "replace-one-client adjacency"}

    def metrics_lost_rounds(self) -> list[int]:
        """The rounds run so far whose records metrics.jsonl lost (damaged between a checkpoint and a resume):
        their weights are in the checkpoint, their metrics are gone."""
        logged = {r["round"] for r in self.history}
        return [t for t in range(1, max(self.start_round, *logged, 0) + 1) if t not in logged]


def _trains_on_one_sample(model: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether a training-mode forward of ``model`` (a copy: batch statistics would change its buffers) takes a
    batch of the one sample ``x`` (BatchNorm refuses one where its features are 1x1)."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return True
    try:
        with torch.no_grad():
            copy.deepcopy(model).train()(x)
    except ValueError:
        return False
    return True


def _memory_record(metrics: dict) -> dict:
    """A client's measured memory this round: its largest step's bytes, its budget and their ratio."""
    used, budget = metrics["memory_bytes"], metrics["memory_budget"]
    return {"used_bytes": used, "budget_bytes": budget, "ratio": used / budget}


def _memory_summary(history: list[dict]) -> dict:
    """Over every client and round that measured its steps: the largest used/budget ratio and the share within
    budget (None for both when none did)."""
    ratios = [c["ratio"] for r in history for c in (r.get("memory") or {}).values()]
    return {"max_memory_ratio": max(ratios, default=None),
            "within_budget": sum(x <= 1 for x in ratios) / len(ratios) if ratios else None}


def _postfix(history: list[dict], headline) -> dict:
    last = history[-1]
    post = {"loss": "-" if last["train_loss"] is None else f"{last['train_loss']:.3f}"}
    evaluated = [r for r in history if r["eval"]]
    if evaluated:
        post["acc"] = f"{headline(evaluated[-1]['eval']):.4f}"
    if last.get("privacy"):
        post["eps"] = f"{last['privacy']['epsilon']:.3g}"
    return post
