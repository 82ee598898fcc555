"""``hetfl bench scaling``: client updates per second of one run at 1, 2, ... processes, and their weights.

The workload is FedAvg with the full-width CNN on Fashion-MNIST, 10 of 100 clients per round
(about 600 samples each, one epoch): the round that ``executors.distributed`` shares. Each process
count runs the same seeded run as ``hetfl run --processes P`` (``--threads`` threads per process),
interleaved over ``repeats`` so a slower minute of the machine hits every count. Rounds 2 .. R-1
are timed (round 1 warms up kernels and sub-model objects; the last one evaluates), as rank 0's
wall time per round, which includes waiting for the slowest rank and the exchange. Printed per
count: the median client updates per second, the speedup over one process, the efficiency
(speedup / processes), the median seconds of the final evaluation (shared too), and whether the
final weights equal the one-process run's bit for bit. The last line is the efficiency at the
largest count.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..errors import HetflError

WORKLOAD = dict(method="alllarge", dataset="fmnist", model="cnn", num_clients=100, client_fraction=0.1,
                local_epochs=1, batch_size=32, lr=0.05, static_bn_samples=1000)


def flags(values: dict) -> list[str]:
    """``hetfl run`` flags of option ``values``."""
    return [arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def timed_run(processes: int, rounds: int, device: str, threads: int, out: Path) -> dict:
    """One run at ``processes`` processes: its training throughput, evaluation seconds and final weights."""
    command = [sys.executable, "-m", "hetfl", "run", *flags({**WORKLOAD, "rounds": rounds, "eval_every": rounds,
                                                            "checkpoint_every": rounds, "device": device}),
               "--out", str(out), "--quiet", "--processes", str(processes)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HetflError(f"bench scaling: the {processes}-process run failed: {last}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if 1 < r["round"] < rounds]
    return {"updates_per_second": sum(r["clients"] for r in timed) / sum(r["seconds"] for r in timed),
            "eval_seconds": records[-1]["eval_seconds"],
            "weights": torch.load(run_dir / "final_model.pt", weights_only=True)}


def run_scaling(processes: list[int], repeats: int = 3, rounds: int = 4, device: str = "cpu", threads: int = 1,
                progress: bool = True) -> str:
    """The scaling report (Markdown table, then the efficiency at the largest count)."""
    if rounds < 3:
        raise HetflError(f"bench scaling: --rounds must be at least 3 (a warm-up, a timed and an evaluated round), "
                         f"got {rounds}")
    counts = sorted(set([1, *processes]))
    found: dict[int, list[dict]] = {p: [] for p in counts}
    same: dict[int, bool] = {p: True for p in counts}
    with tempfile.TemporaryDirectory(prefix="hetfl-scaling-") as tmp:
        for repeat in range(repeats):
            alone = None
            for p in counts:
                measured = timed_run(p, rounds, device, threads, Path(tmp) / f"p{p}-r{repeat}")
                weights = measured.pop("weights")
                alone = alone or weights
                same[p] &= weights.keys() == alone.keys() and all(torch.equal(alone[k], weights[k]) for k in alone)
                found[p].append(measured)
                if progress:
                    print(f"[scaling] repeat {repeat + 1}/{repeats}, {p} process(es): "
                          f"{measured['updates_per_second']:.2f} client updates/s", file=sys.stderr, flush=True)
    base = statistics.median(m["updates_per_second"] for m in found[1])
    lines = [f"FedAvg, CNN x1 on Fashion-MNIST, 10 of 100 clients per round, {threads} thread(s) per process, on "
             f"{device}; rounds 2..{rounds - 1} timed, medians of {repeats}", "",
             "| processes | client updates/s | speedup | efficiency | final evaluation (s) | weights as 1 process |",
             "|---|---|---|---|---|---|"]
    for p in counts:
        rate = statistics.median(m["updates_per_second"] for m in found[p])
        evaluation = statistics.median(m["eval_seconds"] for m in found[p])
        lines.append(f"| {p} | {rate:.2f} | {rate / base:.2f} | {rate / base / p:.2f} | {evaluation:.2f} | "
                     f"{'bit-identical' if same[p] else 'DIFFER'} |")
    top = counts[-1]
    efficiency = statistics.median(m["updates_per_second"] for m in found[top]) / base / top
    lines += ["", f"efficiency at {top} processes: {efficiency:.2f} (median of {repeats})"]
    return "\n".join(lines)
