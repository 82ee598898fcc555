"""``hetfl bench memory``: per-client FedDyn state lives on disk, so server RAM does not grow with clients.

Workload: 1000 clients, DepthFL with FedDyn (each client keeps grad L_k in the
global model's shape, DepthFL Eq. (2)-(3)), a ResNet-18 by default, little data per client
(Fashion-MNIST over 1000 clients: 60 samples each; digits would leave clients a single sample,
whose batch statistics BatchNorm cannot take), 1% of the clients per round, until at least 50
distinct clients have trained. Peak RSS is read after every round; the growth from the first round to
the last is compared with the size of one client's state.
"""

from __future__ import annotations

import resource
import tempfile
from pathlib import Path

from ..methods import config_from
from ..sim import Simulation


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_memory(model: str = "resnet18", num_clients: int = 1000, distinct: int = 50,
               dataset: str = "fmnist", out: str | None = None) -> dict:
    """Print RSS per round and the growth in units of one client's state; returns the figures."""
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        cfg = config_from({"method": "depthfl", "model": model, "dataset": dataset, "num_clients": num_clients,
                                "client_fraction": 10 / num_clients, "rounds": 10_000, "batch_size": 8,
                                "eval_every": 10_000, "checkpoint_every": 10_000, "out": tmp, "name": "memory"})
        sim = Simulation(cfg)
        sim.create_run_dir()
        state_bytes = sum(t.numel() * t.element_size() for t in sim.global_state.values())
        print(f"workload: DepthFL + FedDyn, {model} ({state_bytes / 2**20:.1f} MiB of parameters = one client's "
              f"state), {num_clients} clients, {cfg.clients_per_round} per round, {dataset}")
        seen: set[int] = set()
        rss = []
        t = 0
        while len(seen) < distinct:
            t += 1
            sim.run_round(t)
            seen.update(sim.sample_clients(t))
            rss.append(peak_rss_bytes())
            print(f"round {t}: {len(seen)} distinct clients trained, peak RSS {rss[-1] / 2**20:.0f} MiB")
        on_disk = sum(f.stat().st_size for f in Path(sim.client_store.root).glob("*.pt"))
        growth = rss[-1] - rss[0]
        result = {"rounds": t, "distinct_clients": len(seen), "client_state_bytes": state_bytes,
                  "peak_rss_first_round": rss[0], "peak_rss_last_round": rss[-1], "growth_bytes": growth,
                  "state_on_disk_bytes": on_disk, "growth_in_client_states": growth / state_bytes}
    print(f"client state on disk: {on_disk / 2**20:.0f} MiB for {len(seen)} clients")
    print(f"peak RSS growth from round 1 to round {t}: {growth / 2**20:.1f} MiB = "
          f"{result['growth_in_client_states']:.2f} client states (target < 5)")
    return result
