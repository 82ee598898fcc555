"""``hetfl bench checkpoint``: what one checkpoint costs, against the time of one round.

Workload: DepthFL (FedDyn, so every checkpoint also snapshots the per-client state files) on
Fashion-MNIST with the CNN, 100 clients, 10 per round, evaluated every round: the default
experiment. Each round is timed (training and evaluation, as the run loop does), then a
checkpoint of its state; the medians are printed, and their ratio as the last line.
"""

from __future__ import annotations

import shutil
import statistics
import time
from datetime import datetime

from ..config import Config
from ..methods import config_from
from ..rundir import unlock_run_dir
from ..sim import Simulation


def checkpoint_config(rounds: int, device: str, dataset: str = "fmnist") -> Config:
    """The default experiment under DepthFL, ``rounds`` long."""
    return config_from({"method": "depthfl", "dataset": dataset, "rounds": rounds, "device": device,
                             "out": "runs", "name": f"checkpoint-bench-{datetime.now():%Y%m%d-%H%M%S-%f}"})


def run_checkpoint_bench(rounds: int = 5, device: str = "cpu", dataset: str = "fmnist") -> dict:
    """Median seconds of a round and of a checkpoint over ``rounds`` rounds, and their ratio (printed)."""
    cfg = checkpoint_config(rounds, device, dataset)
    sim = Simulation(cfg)
    sim.create_run_dir()
    round_seconds, checkpoint_seconds = [], []
    try:
        for t in range(1, rounds + 1):
            started = time.perf_counter()
            sim.run_round(t)
            sim.evaluate(t)
            round_seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            sim.save_checkpoint(t)
            checkpoint_seconds.append(time.perf_counter() - started)
        size = (sim.run_dir / "checkpoint" / "state.pt").stat().st_size
        linked = list((sim.run_dir / "checkpoint" / "client_state").glob("*.pt"))
    finally:
        unlock_run_dir(sim.run_dir)
        shutil.rmtree(sim.run_dir, ignore_errors=True)
    r, c = statistics.median(round_seconds), statistics.median(checkpoint_seconds)
    result = {"round_seconds": r, "checkpoint_seconds": c, "ratio": c / r, "checkpoint_bytes": size,
              "every": cfg.checkpoint_every}
    print(f"{cfg.method} on {cfg.dataset}, {cfg.model} width {cfg.model_width}, {cfg.num_clients} clients, "
          f"{cfg.clients_per_round} per round, {rounds} rounds on {device}")
    print(f"round (train + evaluate): median {r:.3f} s  [{', '.join(f'{x:.3f}' for x in round_seconds)}]")
    print(f"checkpoint (state.pt {size / 2**20:.1f} MiB, {len(linked)} client state files hard-linked): "
          f"median {c * 1000:.1f} ms  "
          f"[{', '.join(f'{x * 1000:.1f}' for x in checkpoint_seconds)}]")
    print(f"per round at checkpoint_every={cfg.checkpoint_every}: {100 * c / r / cfg.checkpoint_every:.2f}% of a round")
    print(f"checkpoint / round: {c / r:.4f}")
    return result
