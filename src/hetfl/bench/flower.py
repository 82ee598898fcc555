"""``hetfl bench flower``: the same FedAvg workload in the simulator, as Flower's floor, and as hetfl on Flower.

Workload: FedAvg on the CNN with Fashion-MNIST, 10 clients per round, each holding 600
training samples as in the default experiment (100 clients, 10 per round), 1 local epoch, a few
rounds, evaluated after the last one. On Flower every client is a SuperNode (as ``hetfl deploy``
starts them), so the bench runs 10 clients, all in every round, on the first 6000 training samples
(written as an .npz that the simulator and every node read).

Four columns, each the median time of a round after the first (which starts the run), its evaluation's seconds
left out (the floor does not evaluate):

* the simulator;
* Flower's floor (``flower.floor``): a numpy-only ClientApp on the same SuperLink and SuperNodes,
  sent hetfl's messages array for array (no two alike), that does as much numpy work as a client's
  training instead of training (steps of a convolution, as many as take the CPU seconds of a client's
  training, measured again in the bench process before each of the floor's turns: ``floor_work_now``;
  in the training slots, as hetfl's trainings), and replies with arrays of its own. The floor is what
  Flower costs plus that training;
* hetfl on Flower with the nodes' warm workers (the default);
* hetfl on Flower with cold ClientApps (``worker=off``: each message's process imports torch,
  loads the data and builds the model), on a second federation.

The floor and hetfl's warm runs share one federation, ``repeats`` turns of a run each; within a turn
both runs are live and take their rounds in turn (``flower.baton``: hetfl's round 1, the floor's,
hetfl's round 2, ...), so a slower minute of the machine hits both; hetfl's overhead per message =
(its round - the floor's round of the same turn) / messages per round, reported as the median over
the turns with their spread. Where the time goes: each steady message's stages (``flower.timing``:
delivery, the ClientApp's start, its work, return; for hetfl the worker's phases inside the work)
and the CPU seconds per message of each kind of process in the steady rounds (sampled from /proc,
Linux), the floor's against hetfl's; the largest difference is named. Also printed: the start-up
(until round 1 begins) and the bytes on the wire against the local tensors' sizes. Everything runs
with ``OMP_NUM_THREADS`` as set (the nodes are 10 processes at once).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ..data import load_dataset
from ..methods import config_from
from ..rundir import unlock_run_dir
from ..sim import Simulation

SAMPLES_PER_CLIENT = 600  # the default experiment's: 60000 Fashion-MNIST samples over 100 clients
GOAL_PER_MESSAGE_S = 0.5  # the goal for hetfl's overhead per message with warm workers


def bench_config(folder: Path, nodes: int, rounds: int):
    """The FedAvg config of the bench, on ``nodes`` x 600 Fashion-MNIST training samples written into ``folder``."""
    data = load_dataset("fmnist")
    n = nodes * SAMPLES_PER_CLIENT
    subset = folder / "fmnist-subset.npz"
    np.savez(subset, x_train=data.x_train[:n].numpy(), y_train=data.y_train[:n].numpy(),
             x_test=data.x_test.numpy(), y_test=data.y_test.numpy())
    return config_from(dict(method="alllarge", dataset=f"npz:{subset}", num_clients=nodes, client_fraction=1.0,
                            levels=1, rounds=rounds, eval_every=rounds, out=str(folder)))


def steady_round(history: list[dict]) -> float:
    """The median over a run's round records after the first (which starts the run) of their seconds less their
    evaluation's."""
    seconds = [r["seconds"] - r["eval_seconds"] for r in history]
    return statistics.median(seconds[1:] or seconds)


def run_flower_bench(rounds: int = 3, nodes: int = 10, repeats: int = 3, out: str | None = None) -> dict:
    """The figures of the bench (also printed); runs go to ``out`` (default: a temporary folder, removed)."""
    from ..flower.baton import BATON_ENV, Baton
    from ..flower.deploy import node_configs, sigterm_interrupts
    from ..flower.federation import Federation
    from ..flower.timing import EXCHANGE_LOG
    from ..machine import cores

    with sigterm_interrupts(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = bench_config(folder, nodes, max(rounds, 3))

        started = time.perf_counter()
        sim = Simulation(cfg.replace(name="simulator"))
        sim_startup = time.perf_counter() - started
        sim.run(progress=False)
        sim_round = steady_round(sim.history)
        arrays = {name: [list(t.shape), str(t.numpy().dtype)] for name, t in sim.global_state.items()}

        turns = []  # (the floor's steady round, hetfl's), their rounds in turn on one federation
        sized = [floor_work_now(sim)]  # the floor's work for each turn; the first before the SuperNodes' start-up
        warm_root, exchanges = folder / "federation-warm", folder / "exchanges.jsonl"
        baton = Baton(folder / "baton")
        with Federation(warm_root, nodes=nodes, env={EXCHANGE_LOG: str(exchanges), BATON_ENV: str(baton.path)}) \
                as federation, CpuSampler(warm_root) as sampler:
            for k, config in enumerate(node_configs(nodes, federation.root)):
                federation.add_node(str(k), config)
            for turn in range(1, repeats + 1):
                if turn > 1:  # between turns the federation idles
                    sized.append(floor_work_now(sim))
                baton.give("bench")  # neither run's: the floor hands it to hetfl's once its ServerApp is ready
                floor_run = FloorRun(federation, nodes, cfg.rounds, sized[-1]["units"], arrays, cfg.round_timeout)
                floor, warm = in_turns(federation, baton, floor_run, cfg.replace(name=f"flower-warm-{turn}"))
                turns.append((statistics.median(floor["seconds"][1:]), warm["round"]))
                print(f"turn {turn}/{repeats}: a steady round takes {turns[-1][0]:.2f} s as Flower's floor, "
                      f"{turns[-1][1]:.2f} s as hetfl with warm workers", flush=True)
            messages = steady_messages(warm_root, nodes, exchanges)
            cpu_per_message = {kind: sampler.per_message(found, nodes) for kind, found in messages.items()}
        with Federation(folder / "federation-cold", nodes=nodes) as federation:
            for k, config in enumerate(node_configs(nodes, federation.root, extra={k: {"worker": "off"}
                                                                                 for k in range(nodes)})):
                federation.add_node(str(k), config)
            cold = _hetfl(federation, cfg.replace(name="flower-cold"))

    floor_round = statistics.median(f for f, _ in turns)
    per_turn = [(w - f) / nodes for f, w in turns]
    figures = {
        "rounds": cfg.rounds, "clients_per_round": nodes, "repeats": repeats, "cores": cores(),
        "floor_train_cpu_seconds": statistics.median(z["cpu_seconds"] for z in sized), "floor_sized": sized,
        "startup_s": {"simulator": sim_startup, "warm": warm["startup"], "cold": cold["startup"]},
        "round_s": {"simulator": sim_round, "floor": floor_round, "warm": statistics.median(w for _, w in turns),
                    "cold": cold["round"]},
        "turns_s": [{"floor": f, "warm": w} for f, w in turns],
        "floor_wire_bytes_per_round": statistics.mean(floor["bytes_up"]),  # as much went down
        "stages_s": {kind: message_stage_table(found) for kind, found in messages.items()},
        "cpu_per_message_s": cpu_per_message,
    }
    for way in ("down", "up"):  # as the warm run's rounds counted them: serialised, and the local tensors' sizes
        figures[f"wire_bytes_{way}_per_round"] = statistics.mean(r[f"wire_bytes_{way}"] for r in warm["history"])
        figures[f"local_bytes_{way}_per_round"] = statistics.mean(r[f"bytes_{way}"] for r in warm["history"])
    figures["ratio"] = {k: v / sim_round for k, v in figures["round_s"].items()}
    figures["overhead_per_message_s"] = {"warm": statistics.median(per_turn),
                                         "cold": (cold["round"] - floor_round) / nodes}
    figures["overhead_spread_s"] = [min(per_turn), max(per_turn)]
    report(figures)
    return figures


# ---- where the time goes ---------------------------------------------------------------------------------------------
PROCESS_KINDS = (("hetfl.flower.worker", "hetfl workers"), ("flwr-clientapp", "ClientApps"),
                 ("flwr-serverapp", "ServerApp"), ("flower-superlink", "SuperLink"),
                 ("flower-supernode", "SuperNodes"), ("flower-superexec", "SuperExecs"))


def process_kind(command: str) -> str | None:
    """Which of a federation's processes ``command`` runs (``PROCESS_KINDS``), or None."""
    return next((kind for word, kind in PROCESS_KINDS if word in command), None)


def cpu_by_kind(root: Path, seen: dict | None = None) -> dict[str, float]:
    """The CPU seconds used so far by each kind of process working in ``root`` (Linux /proc): the live ones', the
    exited ones' not yet reaped, and the exited ClientApps' and ServerApps' that their SuperExec reaped (a process
    moves from one to the next, so differences of readings count it once). An exited process keeps its CPU times
    until reaped but no longer shows its cwd or command line: its kind is the one ``seen`` ((pid, start) -> kind,
    filled as processes are read alive) recorded. Flower's SuperExecs reap their children only when they next start
    one, i.e. in the next round, which with the floor's and hetfl's rounds in turn is the other app's."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    seen = {} if seen is None else seen
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            key = (int(entry.name), fields[19])  # its start time: a pid used again is another process
            try:
                inside = Path(os.readlink(entry / "cwd")).is_relative_to(root)
            except OSError:  # exited, not yet reaped (or gone meanwhile)
                inside = None
            if inside:
                seen[key] = process_kind((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            elif inside is False or key not in seen:
                continue
        except OSError:  # gone meanwhile
            continue
        found[int(entry.name)] = (seen[key], int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                                  (int(fields[13]) + int(fields[14])) / tick)
    totals = {kind: 0.0 for _, kind in PROCESS_KINDS}
    for kind, parent, own, reaped in found.values():
        if kind is None:
            continue
        totals[kind] += own
        if kind == "SuperExecs":  # a SuperNode's starts ClientApps, the SuperLink's ServerApps
            parent_kind = found.get(parent, (None,))[0]
            totals["ClientApps" if parent_kind == "SuperNodes" else "ServerApp"] += reaped
    return totals


class CpuSampler:
    """Reads ``cpu_by_kind(root)`` every ``SAMPLE_SECONDS`` in a thread while in its ``with`` block."""

    SAMPLE_SECONDS = 0.25

    def __init__(self, root: Path):
        self.root, self.samples, self.seen = Path(root), [], {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.time(), cpu_by_kind(self.root, self.seen)))
            self.stop.wait(self.SAMPLE_SECONDS)

    def between(self, start: float, end: float) -> dict[str, float]:
        """Each kind's CPU seconds from the last reading at or before ``start`` to the first at or after ``end``."""
        before = [totals for t, totals in self.samples if t <= start] or [self.samples[0][1]]
        after = [totals for t, totals in self.samples if t >= end] or [self.samples[-1][1]]
        return {kind: after[0][kind] - before[-1][kind] for kind in after[0]}

    def per_message(self, messages: list[dict], nodes: int) -> dict[str, float]:
        """Each kind's median CPU seconds per message over the exchanges of ``messages`` (``steady_messages``: one
        exchange, a round, per push time): from its push to its last reply, over ``nodes`` messages."""
        spent = [self.between(pushed, arrived) for pushed, arrived in exchange_spans(messages).items()]
        return {kind: statistics.median(s[kind] for s in spent) / nodes for kind in spent[0]} if spent else {}


def exchange_spans(messages: list[dict]) -> dict[float, float]:
    """Each exchange (a round) of ``messages`` (``steady_messages``): its push time -> its last reply's arrival."""
    spans: dict[float, float] = {}
    for m in messages:
        spans[m["pushed"]] = max(spans.get(m["pushed"], 0.0), m["arrived"])
    return spans


def steady_messages(root: Path, nodes: int, exchanges: Path) -> dict[str, list[dict]]:
    """The timing (``flower.timing``) of every ``train`` message of a round after the first, joined with its
    reply's arrival at the server, by who answered it: ``floor`` (``node-K/floor.log``) or ``warm`` (hetfl's shims,
    ``node-K/worker/worker.log``)."""
    from ..flower.timing import read_timings

    arrivals = {a["message"]: a for a in map(json.loads, exchanges.read_text().splitlines())} if exchanges.exists() \
        else {}
    found: dict[str, list[dict]] = {"floor": [], "warm": []}
    for k in range(nodes):
        for kind, log in (("floor", root / f"node-{k}" / "floor.log"), ("warm", root / f"node-{k}" / "worker" /
                                                                        "worker.log")):
            lines = log.read_text().splitlines() if log.exists() else []
            found[kind] += [{**t, **arrivals[t["message"]]} for t in read_timings(lines)
                            if t["message"] in arrivals and t["round"] not in ("", "1") and t["started"]]
    return found


def message_stages(m: dict) -> dict[str, float]:
    """The stages of one message's time (``flower.timing``), in seconds, with the warm worker's phases."""
    stages = {"delivery": m["started"] - m["created"], "ClientApp start": m["called"] - m["started"],
              "work": m["replied"] - m["called"], "return": m["arrived"] - m["replied"],
              "total": m["arrived"] - m["created"], "ClientApp CPU": m["cpu-replied"]}
    worker = m.get("worker")
    if worker:
        stages |= {"to the worker": worker["accepted"] - m["called"],
                   "in the worker": worker["done"] - worker["accepted"],
                   "back from it": m["replied"] - worker["done"], **worker["phases"]}
    return stages


def message_stage_table(messages: list[dict]) -> dict[str, list[float]]:
    """Each stage's seconds over ``messages``."""
    table: dict[str, list[float]] = {}
    for m in messages:
        for name, seconds in message_stages(m).items():
            table.setdefault(name, []).append(seconds)
    return table


REFERENCE_TRAININGS = 3  # a client's training measured this many times in the bench process before each floor turn


def floor_work_now(sim: Simulation, trainings: int = REFERENCE_TRAININGS) -> dict:
    """The floor's work sized to what a client's training costs in this process now: ``cpu_seconds``, the median
    CPU seconds of ``trainings`` of the simulator's last round's jobs trained again by its executor (``spread``: min
    and max), and the ``units`` of ``floor.work`` that take as long. Sized before each of the floor's turns: a shared
    machine's speed can drift by a quarter within minutes (a 2-core VM: the simulator's round took 22.9-29.2 s in
    runs minutes apart), and a floor sized once at the start would count that drift as hetfl's."""
    from ..flower.floor import units_for

    spent = []
    for job in itertools.islice(sim.jobs(sim.cfg.rounds), trainings):
        started = time.process_time()
        for _ in sim.executor.execute([job], sim.cfg.rounds):
            pass
        spent.append(time.process_time() - started)
    cpu_seconds = statistics.median(spent)
    return {"cpu_seconds": cpu_seconds, "spread": [min(spent), max(spent)], "units": units_for(cpu_seconds)}


def run_floor(federation, nodes: int, rounds: int, work_units: int, arrays: dict, timeout: float) -> dict:
    """The floor app's rounds on ``federation`` (``flower.floor``), each node's message doing ``work_units`` of
    ``floor.work``: their seconds, replies and bytes up."""
    return FloorRun(federation, nodes, rounds, work_units, arrays, timeout).figures()


class FloorRun:
    """The floor app's run, started on ``federation`` (``flower.floor``): its output is read as it comes (it may
    wait for its turns for minutes, ``flower.baton``)."""

    def __init__(self, federation, nodes: int, rounds: int, work_units: int, arrays: dict, timeout: float):
        from ..flower.deploy import app_pyproject, write_app

        self.nodes, self.result = nodes, federation.root / "floor-result.json"
        self.result.unlink(missing_ok=True)
        spec = federation.root / "floor-spec.json"
        spec.write_text(json.dumps({"nodes": nodes, "rounds": rounds, "work_units": work_units, "arrays": arrays,
                                    "timeout": timeout, "out": str(self.result)}))
        app = write_app(federation.root / "floor-app", app_pyproject(
            "hetfl-floor", "Flower's floor for hetfl's bench: a numpy-only ClientApp standing in for training",
            "hetfl.flower.floor:server", "hetfl.flower.floor:client",
            'spec = ""  # the JSON file of the rounds to run'))
        self.process = federation.run_app(app, {"spec": str(spec)})
        self.output: list[str] = []
        self.reader = threading.Thread(target=lambda: self.output.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def ended(self) -> bool:
        return self.process.poll() is not None

    def figures(self) -> dict:
        """Its rounds' seconds, replies and bytes up, once it ends; DeployFailed when it failed."""
        from ..flower.deploy import DeployFailed

        self.process.wait()
        self.reader.join()
        output = "".join(self.output)
        if not self.result.exists():
            raise DeployFailed(f"Flower's floor did not finish: {output[-2000:]}")
        figures = json.loads(self.result.read_text())
        if min(figures["replies"]) < self.nodes:
            raise DeployFailed(f"Flower's floor got {figures['replies']} replies per round of {self.nodes} nodes: "
                               f"{output[-2000:]}")
        return figures

    def stop(self) -> None:
        """Returns None; ends its ``flwr run`` if it is still going (hetfl's run failed)."""
        if not self.ended():
            self.process.kill()
            self.process.wait()


def in_turns(federation, baton, floor_run: FloorRun, cfg) -> tuple[dict, dict]:
    """The floor's figures and hetfl's run (``_hetfl``) of one turn, their rounds taken in turn (``flower.baton``):
    hetfl's run starts once the floor's ServerApp waits for its first turn; the floor's last round comes after
    hetfl's run has ended, so neither's last round shares the machine with the other's ending."""
    from ..flower.baton import FLOOR, HETFL
    from ..flower.deploy import DeployFailed

    try:
        deadline = time.monotonic() + cfg.round_timeout
        while baton.holder() != HETFL:  # the floor hands it over once its nodes are there
            if floor_run.ended():
                floor_run.figures()  # raises with its output
            if time.monotonic() > deadline:
                raise DeployFailed(f"Flower's floor did not start within {cfg.round_timeout:g} s")
            time.sleep(0.1)
        warm = _hetfl(federation, cfg)
        baton.give(FLOOR)
        return floor_run.figures(), warm
    finally:
        floor_run.stop()


def _hetfl(federation, cfg) -> dict:
    """hetfl's run of ``cfg`` on ``federation``: its start-up, its steady round and its round records."""
    from ..flower.deploy import run_on

    run_dir = Simulation(cfg).create_run_dir()
    unlock_run_dir(run_dir)  # the ServerApp takes it over
    first_round: dict = {}
    watcher = threading.Thread(target=_watch_first_round, args=(run_dir / "metrics.jsonl", first_round), daemon=True)
    started = time.perf_counter()
    watcher.start()
    run_on(federation, run_dir)
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"startup": first_round["at"] - started - history[0]["seconds"], "history": history,
            "round": steady_round(history)}


def report(figures: dict) -> None:
    """Returns None; prints the bench's tables."""
    nodes = figures["clients_per_round"]
    print(f"FedAvg, CNN on Fashion-MNIST, {nodes} clients per round ({SAMPLES_PER_CLIENT} samples each), "
          f"{figures['rounds']} rounds; Flower: a SuperLink and {nodes} SuperNodes on loopback, {figures['cores']} "
          f"cores; the floor and hetfl (warm) took {figures['repeats']} turns each")
    columns = (("simulator", "simulator"), ("floor", "Flower floor"), ("warm", "hetfl, warm"), ("cold", "hetfl, cold"))
    print(f"{'':34}" + "".join(f"{title:>14}" for _, title in columns))
    startup = figures["startup_s"]
    print(f"{'start-up (s)':34}" + "".join(f"{startup[k]:14.2f}" if k in startup else f"{'-':>14}"
                                           for k, _ in columns))
    print(f"{'time per round (s)':34}" + "".join(f"{figures['round_s'][k]:14.2f}" for k, _ in columns))
    print(f"{'/ simulator':34}" + "".join(f"{figures['ratio'][k]:14.2f}" for k, _ in columns))
    overhead, (low, high) = figures["overhead_per_message_s"], figures["overhead_spread_s"]
    label = "hetfl's overhead per message (s)"
    print(f"{label:34}{'':28}" + "".join(f"{overhead[k]:14.2f}" for k in ("warm", "cold")))
    sized = figures["floor_sized"]
    print("The floor's ClientApp does numpy work per message sized before each turn to a client's training in the "
          "bench process then: " + ", ".join(f"{z['units']} steps for {z['cpu_seconds']:.2f} CPU-s" for z in sized))
    for way in ("down", "up"):
        wire, local = figures[f"wire_bytes_{way}_per_round"], figures[f"local_bytes_{way}_per_round"]
        print(f"bytes {way} per round: {wire:,.0f} on the wire, {local:,.0f} in the local tensors "
              f"(+{100 * (wire / local - 1):.3f}%: a header per tensor)")
    print(f"Flower's floor: {figures['floor_wire_bytes_per_round']:,.0f} bytes on the wire per round, each way")
    report_stages(figures["stages_s"])
    report_cpu(figures["cpu_per_message_s"])
    verdict = "met" if overhead["warm"] <= GOAL_PER_MESSAGE_S else "NOT met"
    print(f"hetfl's overhead per message with warm workers: {overhead['warm']:.2f} s, median of "
          f"{figures['repeats']} turns [{low:.2f}..{high:.2f}] (goal <= {GOAL_PER_MESSAGE_S} s: {verdict}); cold "
          f"ClientApps: {overhead['cold']:.2f} s")


def report_stages(stages: dict[str, dict[str, list[float]]]) -> None:
    """Returns None; prints each stage of a steady message, median [min..max], the floor's against hetfl's, and
    names the stage where hetfl's message spends the most beyond the floor's."""
    floor, warm = stages["floor"], stages["warm"]
    if not floor or not warm:
        print("(no message timings: they need Linux's /proc)")
        return
    print(f"a steady message, median [min..max] over {len(floor['total'])} of the floor's and {len(warm['total'])} "
          "of hetfl's (s):")
    outer = ("delivery", "ClientApp start", "work", "return", "total", "ClientApp CPU")
    print(f"  {'':22}{'Flower floor':>26}{'hetfl, warm':>26}")
    for name in outer:
        print(f"  {name:22}{_spread(floor[name]):>26}{_spread(warm[name]):>26}")
    inner = [name for name in warm if name not in outer]
    print("  hetfl's work: " + ", ".join(f"{name} {_spread(warm[name])}" for name in inner))
    extra = {name: statistics.median(warm[name]) - statistics.median(floor[name]) for name in outer[:4]}
    largest = max(extra, key=extra.get)
    print("  hetfl beyond the floor, per message: " + ", ".join(f"{k} {v:+.2f} s" for k, v in extra.items())
          + f"; the largest: {largest}")


def report_cpu(cpu: dict[str, dict[str, float]]) -> None:
    """Returns None; prints each kind of process's CPU seconds per message in the steady rounds, the floor's against
    hetfl's, and names the kind whose CPU grew most."""
    floor, warm = cpu.get("floor"), cpu.get("warm")
    if not floor or not warm:
        return
    kinds = [kind for kind in warm if floor[kind] or warm[kind]]
    print("CPU seconds per message in the steady rounds (median round), the floor / hetfl: " + ", ".join(
        f"{kind} {floor[kind]:.2f} / {warm[kind]:.2f}" for kind in kinds)
          + f"; all {sum(floor.values()):.2f} / {sum(warm.values()):.2f}")
    client = ("ClientApps", "hetfl workers")  # the floor's ClientApp trains; hetfl's hands it to the worker
    parts = {"the client side (ClientApp and worker)": client,
             **{kind: (kind,) for kind in kinds if kind not in client}}
    growth = {name: sum(warm[k] - floor[k] for k in group) for name, group in parts.items()}
    largest = max(growth, key=growth.get)
    print("  hetfl beyond the floor, CPU-s per message: " + ", ".join(f"{k} {v:+.2f}" for k, v in growth.items())
          + f"; the largest: {largest}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def _watch_first_round(metrics: Path, found: dict) -> None:
    """Returns None once ``metrics`` holds a whole line; records the time it did in ``found["at"]``."""
    while not (metrics.exists() and "\n" in metrics.read_text()):
        time.sleep(0.05)
    found["at"] = time.perf_counter()
