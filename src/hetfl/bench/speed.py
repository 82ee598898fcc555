"""``hetfl bench speed``: the simulator's time against a bare PyTorch loop doing the same SGD steps.

Workload: FedAvg on Fashion-MNIST, the CNN, 100 clients, 10 per round, 1 local epoch.
The bare loop uses the same initial weights, the same sampled clients, the same batches (the same
seeded permutations) and the same loss, then a sample-weighted average; both are timed over the
same rounds, in alternating order, and the ratio of their medians is printed as the last line.
Before it, one evaluation (static BN statistics of ``static_bn_samples`` training images, then
the test set) is timed against its floor: the two bare forward passes, over the same images in
the same chunks, that any such evaluation must make.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from ..config import Config
from ..evaluate import STATS_CHUNK
from ..seeding import torch_generator
from ..sim import Simulation
from ..trainers.schedule import batches


def speed_config(rounds: int, device: str, dataset: str = "fmnist") -> Config:
    """The FedAvg workload of the speed benchmark."""
    return Config(method="alllarge", dataset=dataset, num_clients=100, client_fraction=0.1, local_epochs=1,
                  rounds=rounds, device=device, batch_size=32, lr=0.05)


def bare_rounds(sim: Simulation, rounds: int) -> dict[str, torch.Tensor]:
    """FedAvg written as a plain PyTorch loop over the simulator's clients and batches; the final weights."""
    cfg = sim.cfg
    model = sim.method.family.build().to(sim.device)
    state = {k: v.clone() for k, v in sim.method.init_state(cfg.seed).params.items()}
    for t in range(1, rounds + 1):
        sums = {k: torch.zeros_like(v) for k, v in state.items()}
        total = 0
        for client in sim.sample_clients(t):
            model.load_state_dict(state)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=cfg.lr_at(t), momentum=cfg.momentum,
                                  weight_decay=cfg.weight_decay)
            indices = sim.parts[client]
            for batch in batches(len(indices), cfg.batch_size, torch_generator(cfg.seed, "train", t, client)):
                idx = indices[batch]
                loss = sum(F.cross_entropy(o, sim.y_train[idx]) for o in model(sim.x_train[idx]))
                opt.zero_grad()
                loss.backward()
                opt.step()
            for k, v in model.state_dict().items():
                sums[k].add_(v, alpha=len(indices))
            total += len(indices)
        state = {k: s / total for k, s in sums.items()}
    return state


def simulator_rounds(sim: Simulation, rounds: int) -> dict[str, torch.Tensor]:
    """The simulator's own round loop from a fresh global state; the final weights."""
    sim.state = sim.method.init_state(sim.cfg.seed)
    for t in range(1, rounds + 1):
        sim.run_round(t)
    return sim.global_state


@torch.no_grad()
def bare_evaluation(sim: Simulation) -> float:
    """The floor of an evaluation with static BN: a training-mode forward over the statistics images in
    chunks of ``STATS_CHUNK``, then an eval-mode forward over the test set; the accuracy (with batch
    statistics, which static BN replaces, so not the simulator's)."""
    model = sim.method.family.build().to(sim.device)
    model.load_state_dict(sim.global_state)
    model.train()
    for start in range(0, len(sim.x_bn), STATS_CHUNK):
        model(sim.x_bn[start:start + STATS_CHUNK])
    model.eval()
    size, correct = sim.cfg.eval_batch_size, 0
    for start in range(0, len(sim.y_test), size):
        correct += (model(sim.x_test[start:start + size])[-1].argmax(1) == sim.y_test[start:start + size]).sum()
    return float(correct) / len(sim.y_test)


def timed(fn, *args) -> tuple[float, object]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def run_speed(rounds: int = 2, repeats: int = 3, device: str = "cpu", dataset: str = "fmnist") -> float:
    """Print per-repeat times and the median ratio simulator / bare loop (last line); returns the ratio."""
    sim = Simulation(speed_config(rounds, device, dataset))  # run_round needs no run folder for FedAvg
    print(f"workload: FedAvg, {sim.cfg.dataset}, cnn ({sum(v.numel() for v in sim.global_state.values()):,} params), "
          f"{sim.cfg.num_clients} clients, {sim.cfg.clients_per_round} per round, {rounds} rounds, "
          f"{sim.cfg.local_epochs} local epoch, batch {sim.cfg.batch_size}, device {device}, "
          f"{torch.get_num_threads()} threads")
    sim_times, bare_times = [], []
    for r in range(repeats):
        order = [("sim", simulator_rounds), ("bare", bare_rounds)]
        if r % 2:
            order.reverse()
        results = {}
        for name, fn in order:
            seconds, results[name] = timed(fn, sim, rounds)
            (sim_times if name == "sim" else bare_times).append(seconds)
        diff = max((results["sim"][k] - results["bare"][k]).abs().max().item() for k in results["sim"])
        print(f"repeat {r + 1}: simulator {sim_times[-1]:.2f} s, bare loop {bare_times[-1]:.2f} s, "
              f"ratio {sim_times[-1] / bare_times[-1]:.3f}, max |weight difference| {diff:.2e}")
    evaluation, floor = [], []
    for r in range(repeats):
        for name, fn in ([("sim", sim.evaluate), ("bare", bare_evaluation)] if r % 2 == 0 else
                         [("bare", bare_evaluation), ("sim", sim.evaluate)]):
            seconds, _ = timed(fn) if name == "sim" else timed(fn, sim)
            (evaluation if name == "sim" else floor).append(seconds)
    print(f"evaluation with static BN ({len(sim.x_bn)} statistics + {len(sim.y_test)} test images) / its two bare "
          f"forward passes (median of {repeats}): {statistics.median(evaluation):.2f} s / "
          f"{statistics.median(floor):.2f} s = {statistics.median(evaluation) / statistics.median(floor):.3f}")
    ratio = statistics.median(sim_times) / statistics.median(bare_times)
    print(f"simulator / bare-loop time (median of {repeats}): {ratio:.3f}")
    return ratio
