"""``hetfl bench throughput``: client updates per second of the sequential and the batched executor.

Workloads: FedAvg with the CNN at widths 0.25 and 1 on Fashion-MNIST, 10 and 100 clients
per round (1,000 clients of 60 samples: pfl-research's setting of many small clients), and MiniLM
with LoRA on Reuters R8 (10 of 100 clients per round; skipped when the text extra is missing).
Each executor runs one warm-up round (kernels, sub-model objects), then ``repeats`` timed rounds
from the same seeded state; printed per workload: client updates per second and samples per second
(the device-utilisation proxy) of both, their ratio, the peak device memory (CUDA), and the largest
difference between the two executors' final weights (the same rounds, so equal up to rounding).
The last line is the median ratio batched / sequential over the workloads.

On a CPU, stacking clients does not pay (the kernels already fill the cores), which is why
``--executor auto`` picks the sequential executor there; the bench says so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..config import Config
from ..errors import HetflError
from ..sim import Simulation

IMAGES = dict(method="alllarge", dataset="fmnist", model="cnn", num_clients=1000, local_epochs=1, batch_size=32,
              lr=0.05, static_bn_samples=1000)
WORKLOADS = {
    "cnn x0.25, 10 clients/round": dict(IMAGES, model_width=0.25, client_fraction=0.01),
    "cnn x0.25, 100 clients/round": dict(IMAGES, model_width=0.25, client_fraction=0.1),
    "cnn x1, 10 clients/round": dict(IMAGES, model_width=1.0, client_fraction=0.01),
    "cnn x1, 100 clients/round": dict(IMAGES, model_width=1.0, client_fraction=0.1),
    "minilm lora, 10 clients/round": dict(method="alllarge", dataset="r8", model="minilm", finetune="lora",
                                          max_length=64, num_clients=100, client_fraction=0.1, batch_size=16,
                                          lr=0.05),
}


@dataclass
class Measured:
    """One executor on one workload: median seconds per round, what a round trains, peak memory, final weights."""

    seconds: float
    clients: int
    samples: int
    peak_bytes: int | None
    weights: dict[str, torch.Tensor]

    @property
    def updates_per_second(self) -> float:
        """Client updates per second."""
        return self.clients / self.seconds

    @property
    def samples_per_second(self) -> float:
        """Training samples per second."""
        return self.samples / self.seconds


def synchronize(device: torch.device) -> None:
    """Returns None once the device has finished its queued work (a timing boundary)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg: Config, executor: str, repeats: int) -> Measured:
    """One warm-up round, then ``repeats`` timed rounds of ``cfg`` with ``executor``."""
    sim = Simulation(cfg.replace(executor=executor))
    device = sim.device
    sim.run_round(1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, clients, samples = [], [], []
    for t in range(2, repeats + 2):
        synchronize(device)
        start = time.perf_counter()
        log = sim.run_round(t)
        synchronize(device)
        times.append(time.perf_counter() - start)
        clients.append(log.clients)
        samples.append(sum(len(sim.parts[c]) for c in sim.sample_clients(t)) * cfg.local_epochs)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Measured(statistics.median(times), round(statistics.median(clients)), round(statistics.median(samples)),
                    peak, sim.global_state)


def run_throughput(device: str = "cpu", repeats: int = 2, workloads: list[str] | None = None) -> float:
    """Print both executors' throughput on every workload and the median ratio (last line); returns the ratio."""
    if repeats < 1:
        raise HetflError(f"bench throughput: --repeats must be >= 1, got {repeats}")
    names = workloads or list(WORKLOADS)
    print(f"device {device}, {torch.get_num_threads()} threads, {repeats} timed round(s) after one warm-up per "
          "executor; FedAvg, 1 local epoch")
    ratios = []
    for name in names:
        cfg = Config.from_dict({**WORKLOADS[name], "device": device, "rounds": repeats + 1})
        try:
            sequential, batched = (measure(cfg, executor, repeats) for executor in ("sequential", "batched"))
        except HetflError as e:  # a missing extra or dataset: the other workloads still run
            print(f"{name}: skipped ({e})")
            continue
        diff = max((sequential.weights[k] - batched.weights[k]).abs().max().item() for k in sequential.weights)
        ratio = batched.updates_per_second / sequential.updates_per_second
        ratios.append(ratio)
        memory = "" if sequential.peak_bytes is None else \
            f", peak memory {sequential.peak_bytes / 2**20:.0f} / {batched.peak_bytes / 2**20:.0f} MiB"
        print(f"{name}: sequential {sequential.updates_per_second:.1f} updates/s "
              f"({sequential.samples_per_second:.0f} samples/s), batched {batched.updates_per_second:.1f} updates/s "
              f"({batched.samples_per_second:.0f} samples/s): x{ratio:.2f}{memory}, "
              f"max |weight difference| {diff:.1e}")
    if not ratios:
        raise HetflError("bench throughput: no workload could run")
    if torch.device(device).type != "cuda":
        print("on a CPU the kernels already fill the cores, so --executor auto trains one client at a time there")
    ratio = statistics.median(ratios)
    print(f"batched / sequential client updates per second (median of {len(ratios)} workloads): {ratio:.2f}")
    return ratio
