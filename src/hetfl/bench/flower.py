"""``hetfl bench flower``: the same FedAvg workload in the simulator, as Flower's floor, and as hetfl on Flower.

Workload: FedAvg on the CNN with Fashion-MNIST, 10 clients per round, each holding 600
training samples as in the default experiment (100 clients, 10 per round), 1 local epoch, a few
rounds, evaluated after the last one. On Flower every client is a SuperNode (as ``hetfl deploy``
starts them), so the bench runs 10 clients, all in every round, on the first 6000 training samples
(written as an .npz that the simulator and every node read).

Four columns, each the median time of a round that neither starts its run nor evaluates:

* the simulator;
* Flower's floor (``flower.floor``): a numpy-only ClientApp on the same SuperLink and SuperNodes,
  with hetfl's message sizes, that keeps a core busy for the CPU seconds a client's training takes
  in the simulator (its steady rounds' CPU time over the clients) instead of training. The floor is
  what Flower costs plus that training;
* hetfl on Flower with the nodes' warm workers (the default);
* hetfl on Flower with cold ClientApps (``worker=off``: each message's process imports torch,
  loads the data and builds the model), on a second federation.

hetfl's overhead per message = (its round - the floor's round) / messages per round. Also printed:
the start-up (until round 1 begins) and the bytes on the wire against the local tensors' sizes.
Everything runs with ``OMP_NUM_THREADS`` as set (the nodes are 10 processes at once).
"""

from __future__ import annotations

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


def steady_rounds(seconds: list[float], evaluated: list[bool]) -> float:
    """The median of the rounds' ``seconds`` that neither start the run nor evaluate (all of them if none)."""
    steady = [s for s, e in zip(seconds[1:], evaluated[1:]) if not e]
    return statistics.median(steady or seconds)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_flower_bench(rounds: int = 3, nodes: int = 10, out: str | None = None) -> dict:
    """The figures of the bench (also printed); runs go to ``out`` (default: a temporary folder, removed)."""
    from ..flower.deploy import node_configs, sigterm_interrupts
    from ..flower.federation import Federation

    with sigterm_interrupts(), tempfile.TemporaryDirectory() as tmp:
        folder = Path(out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = bench_config(folder, nodes, max(rounds, 3))

        started, cpu = time.perf_counter(), []
        sim = Simulation(cfg.replace(name="simulator"), on_round=lambda sim, record: cpu.append(time.process_time()))
        sim_startup = time.perf_counter() - started
        cpu.append(time.process_time())
        sim.run(progress=False)
        evaluated = [bool(r["eval"]) for r in sim.history]
        sim_round = steady_rounds([r["seconds"] for r in sim.history], evaluated)
        train_cpu_seconds = steady_rounds([b - a for a, b in zip(cpu, cpu[1:])], evaluated) / nodes
        arrays = {name: [list(t.shape), str(t.numpy().dtype)] for name, t in sim.global_state.items()}

        runs = {}
        for label, extra in (("warm", {}), ("cold", {k: {"worker": "off"} for k in range(nodes)})):
            with Federation(folder / f"federation-{label}") as federation:
                for k, config in enumerate(node_configs(nodes, federation.root, extra=extra)):
                    federation.add_node(str(k), config)
                if label == "warm":  # the floor on the same SuperLink and SuperNodes
                    floor = run_floor(federation, nodes, cfg.rounds, train_cpu_seconds, arrays, cfg.round_timeout)
                runs[label] = _hetfl(federation, cfg.replace(name=f"flower-{label}"))
                if label == "warm":
                    phases = worker_phases(federation.root, nodes)

    figures = {
        "rounds": cfg.rounds, "clients_per_round": nodes, "cores": cores(), "floor_train_cpu_seconds": train_cpu_seconds,
        "startup_s": {"simulator": sim_startup, **{k: v["startup"] for k, v in runs.items()}},
        "round_s": {"simulator": sim_round, "floor": steady_rounds(floor["seconds"], [False] * len(floor["seconds"])),
                    **{k: v["round"] for k, v in runs.items()}},
        "floor_wire_bytes_per_round": statistics.mean(floor["bytes_up"]),  # as much went down (an echo)
        "worker_phases_s": phases,
    }
    for way in ("down", "up"):  # as the warm run's rounds counted them: serialised, and the local tensors' sizes
        figures[f"wire_bytes_{way}_per_round"] = statistics.mean(r[f"wire_bytes_{way}"] for r in runs["warm"]["history"])
        figures[f"local_bytes_{way}_per_round"] = statistics.mean(r[f"bytes_{way}"] for r in runs["warm"]["history"])
    figures["ratio"] = {k: v / sim_round for k, v in figures["round_s"].items()}
    figures["overhead_per_message_s"] = {k: (figures["round_s"][k] - figures["round_s"]["floor"]) / nodes
                                         for k in runs}
    report(figures)
    return figures


def worker_phases(root: Path, nodes: int) -> dict[str, list[float]]:
    """Each phase's seconds (``flower.worker.handle``'s log line) over the warm messages of the nodes' workers under
    ``root`` (``node_configs``' state folders), each worker's first message left out (it builds the trainer)."""
    found: dict[str, list[float]] = {}
    for k in range(nodes):
        log = root / f"node-{k}" / "worker" / "worker.log"
        lines = log.read_text().splitlines() if log.exists() else []
        for line in [line for line in lines if "; phases " in line][1:]:
            for name, seconds in json.loads(line.split("; phases ", 1)[1]).items():
                found.setdefault(name, []).append(seconds)
    return found


def run_floor(federation, nodes: int, rounds: int, train_cpu_seconds: float, arrays: dict, timeout: float) -> dict:
    """The floor app's rounds on ``federation`` (``flower.floor``): their seconds, replies and bytes up."""
    from ..flower.deploy import DeployFailed, app_pyproject, write_app

    spec, result = federation.root / "floor-spec.json", federation.root / "floor-result.json"
    spec.write_text(json.dumps({"nodes": nodes, "rounds": rounds, "train_cpu_seconds": train_cpu_seconds, "arrays": arrays,
                                "timeout": timeout, "out": str(result)}))
    app = write_app(federation.root / "floor-app", app_pyproject(
        "hetfl-floor", "Flower's floor for hetfl's bench: a numpy-only ClientApp standing in for training",
        "hetfl.flower.floor:server", "hetfl.flower.floor:client", 'spec = ""  # the JSON file of the rounds to run'))
    process = federation.run_app(app, {"spec": str(spec)})
    output, _ = process.communicate()
    if not result.exists():
        raise DeployFailed(f"Flower's floor did not finish: {output[-2000:]}")
    figures = json.loads(result.read_text())
    if min(figures["replies"]) < nodes:
        raise DeployFailed(f"Flower's floor got {figures['replies']} replies per round of {nodes} nodes: {output}")
    return figures


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
            "round": steady_rounds([r["seconds"] for r in history], [bool(r["eval"]) for r in history])}


def report(figures: dict) -> None:
    """Returns None; prints the bench's table."""
    nodes = figures["clients_per_round"]
    print(f"FedAvg, CNN on Fashion-MNIST, {nodes} clients per round ({SAMPLES_PER_CLIENT} samples each), "
          f"{figures['rounds']} rounds; Flower: a SuperLink and {nodes} SuperNodes on loopback, {figures['cores']} "
          "cores")
    columns = (("simulator", "simulator"), ("floor", "Flower floor"), ("warm", "hetfl, warm"), ("cold", "hetfl, cold"))
    print(f"{'':34}" + "".join(f"{title:>14}" for _, title in columns))
    startup = figures["startup_s"]
    print(f"{'start-up (s)':34}" + "".join(f"{startup[k]:14.2f}" if k in startup else f"{'-':>14}"
                                           for k, _ in columns))
    print(f"{'time per round (s)':34}" + "".join(f"{figures['round_s'][k]:14.2f}" for k, _ in columns))
    print(f"{'/ simulator':34}" + "".join(f"{figures['ratio'][k]:14.2f}" for k, _ in columns))
    overhead = figures["overhead_per_message_s"]
    label = "hetfl's overhead per message (s)"
    print(f"{label:34}{'':28}" + "".join(f"{overhead[k]:14.2f}" for k in ("warm", "cold")))
    print(f"The floor's ClientApp spends {figures['floor_train_cpu_seconds']:.2f} CPU-s per message, what a client's "
          "training takes in the simulator.")
    for way in ("down", "up"):
        wire, local = figures[f"wire_bytes_{way}_per_round"], figures[f"local_bytes_{way}_per_round"]
        print(f"bytes {way} per round: {wire:,.0f} on the wire, {local:,.0f} in the local tensors "
              f"(+{100 * (wire / local - 1):.3f}%: a header per tensor)")
    print(f"Flower's floor: {figures['floor_wire_bytes_per_round']:,.0f} bytes on the wire per round, each way")
    phases = figures["worker_phases_s"]
    if phases:
        count = len(next(iter(phases.values())))
        print(f"a warm message in its node's worker, median [min..max] over {count} messages (s): " + ", ".join(
            f"{name} {statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]" for name, v in phases.items()))
        print(f"training CPU per message: {statistics.median(phases['train-cpu']):.2f} s in the workers ({nodes} at "
              f"once on {figures['cores']} cores), {figures['floor_train_cpu_seconds']:.2f} s in the simulator alone "
              "(what the floor burns)")
    verdict = "met" if overhead["warm"] <= GOAL_PER_MESSAGE_S else "NOT met"
    print(f"hetfl's overhead per message with warm workers: {overhead['warm']:.2f} s (goal <= {GOAL_PER_MESSAGE_S} s: "
          f"{verdict}); cold ClientApps: {overhead['cold']:.2f} s")


def _watch_first_round(metrics: Path, found: dict) -> None:
    """Returns None once ``metrics`` holds a whole line; records the time it did in ``found["at"]``."""
    while not (metrics.exists() and "\n" in metrics.read_text()):
        time.sleep(0.05)
    found["at"] = time.perf_counter()
