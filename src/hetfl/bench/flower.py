"""``hetfl bench flower``: the same FedAvg workload in the simulator and on Flower SuperNodes on loopback.

Workload (issue 12): FedAvg on the CNN with Fashion-MNIST, 10 clients per round, each holding 600
training samples as in the default experiment (100 clients, 10 per round), 1 local epoch, a few
rounds, evaluated after the last one. On Flower every client is a SuperNode (``hetfl deploy``),
so the bench runs 10 clients, all in every round, on the first 6000 training samples (written as
an .npz that the simulator and every node read). Printed: the start-up time (until round 1
begins), the median time of a round that neither starts the run nor evaluates, their ratio
(the goal is at most 1.3), and the bytes on the wire per round against the sum of the local
tensors' sizes. Both run with ``OMP_NUM_THREADS`` as set (the nodes are 10 processes at once).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ..data import load_dataset
from ..methods import config_from
from ..sim import Simulation

SAMPLES_PER_CLIENT = 600  # the default experiment's: 60000 Fashion-MNIST samples over 100 clients


def bench_config(folder: Path, nodes: int, rounds: int):
    """The FedAvg config of the bench, on ``nodes`` x 600 Fashion-MNIST training samples written into ``folder``."""
    data = load_dataset("fmnist")
    n = nodes * SAMPLES_PER_CLIENT
    subset = folder / "fmnist-subset.npz"
    np.savez(subset, x_train=data.x_train[:n].numpy(), y_train=data.y_train[:n].numpy(),
             x_test=data.x_test.numpy(), y_test=data.y_test.numpy())
    return config_from(dict(method="alllarge", dataset=f"npz:{subset}", num_clients=nodes, client_fraction=1.0,
                            levels=1, rounds=rounds, eval_every=rounds, out=str(folder)))


def steady_rounds(history: list[dict]) -> float:
    """The median time of the rounds that neither start the run nor evaluate (all of them if there are none)."""
    steady = [r["seconds"] for r in history[1:] if not r["eval"]]
    return statistics.median(steady or [r["seconds"] for r in history])


def run_flower_bench(rounds: int = 3, nodes: int = 10, out: str | None = None) -> dict:
    """The figures of the bench (also printed); runs go to ``out`` (default: a temporary folder, removed)."""
    from ..flower.deploy import deploy

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = bench_config(folder, nodes, max(rounds, 3))

        started = time.perf_counter()
        sim = Simulation(cfg.replace(name="simulator"))
        sim_startup = time.perf_counter() - started
        sim.run(progress=False)

        run_dir = Simulation(cfg.replace(name="flower")).create_run_dir()
        first_round = {}
        watcher = threading.Thread(target=_watch_first_round, args=(run_dir / "metrics.jsonl", first_round),
                                   daemon=True)
        started = time.perf_counter()
        watcher.start()
        deploy(run_dir, nodes)
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        flower_startup = first_round["at"] - started - history[0]["seconds"]

    figures = {
        "rounds": len(history), "clients_per_round": nodes,
        "startup_s": {"simulator": sim_startup, "flower": flower_startup},
        "round_s": {"simulator": steady_rounds(sim.history), "flower": steady_rounds(history)},
        "wire_bytes_down_per_round": statistics.mean(r["wire_bytes_down"] for r in history),
        "wire_bytes_up_per_round": statistics.mean(r["wire_bytes_up"] for r in history),
        "local_bytes_down_per_round": statistics.mean(r["bytes_down"] for r in history),
        "local_bytes_up_per_round": statistics.mean(r["bytes_up"] for r in history),
    }
    figures["ratio"] = figures["round_s"]["flower"] / figures["round_s"]["simulator"]
    print(f"FedAvg, CNN on Fashion-MNIST, {nodes} clients per round ({SAMPLES_PER_CLIENT} samples each), "
          f"{figures['rounds']} rounds; Flower: a SuperLink and {nodes} SuperNodes on loopback")
    print(f"{'':24}{'simulator':>12}{'Flower':>12}")
    for label, key in (("start-up (s)", "startup_s"), ("time per round (s)", "round_s")):
        print(f"{label:24}{figures[key]['simulator']:12.2f}{figures[key]['flower']:12.2f}")
    for way in ("down", "up"):
        wire, local = figures[f"wire_bytes_{way}_per_round"], figures[f"local_bytes_{way}_per_round"]
        print(f"bytes {way} per round: {wire:,.0f} on the wire, {local:,.0f} in the local tensors "
              f"(+{100 * (wire / local - 1):.3f}%: a header per tensor)")
    print(f"Flower / simulator time per round: {figures['ratio']:.2f} (goal <= 1.3)")
    return figures


def _watch_first_round(metrics: Path, found: dict) -> None:
    """Returns None once ``metrics`` holds a whole line; records the time it did in ``found["at"]``."""
    while not (metrics.exists() and "\n" in metrics.read_text()):
        time.sleep(0.05)
    found["at"] = time.perf_counter()
