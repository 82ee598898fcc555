"""What computed a run: the hardware of each of its segments (a run resumed elsewhere has several).

A run's name and values do not depend on the device (``bench/runner.NAMED_ON_DEVICE``), but kernels do: the same
config trained with another CPU instruction set or on a GPU gives other floating-point results, and a kernel can be
wrong on one machine only (oneDNN's strided 1x1 convolution on AVX2, ``models.cifar_resnet``). Each segment's
record lets a table's reader tell which hardware made which rounds.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from functools import cache
from pathlib import Path

from .errors import HetflError


@cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what ``platform`` says; "" where nothing does)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_each(processes: int) -> int:
    """The threads each of ``processes`` computing processes started together gets: ``OMP_NUM_THREADS`` where it
    is set (the cores are shared with other work, as a suite beside a pilot), else an even share of this process's
    cores, at least one. A share larger than the cores left is costly: OpenMP's threads wait for each other at every
    kernel's end, so one thread too many on a busy core slows the whole team (a one-worker suite given both cores
    beside a one-thread pilot trained 3-4x slower than alone). HetflError for an ``OMP_NUM_THREADS`` that is no
    positive count."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not given:
        return max(1, cores() // processes)
    if not given.isdigit() or int(given) < 1:
        raise HetflError(f"OMP_NUM_THREADS must be a positive number of threads, got '{given}'")
    return int(given)


class OthersBusy:
    """How many cores other processes kept busy while a ``with`` block ran: the machine's busy CPU time
    (``/proc/stat``: user, nice, system, irq, softirq, steal; a container reads its host's) less this process's own
    (``time.process_time``: all its threads), over the block's wall time. ``cores`` is None where ``/proc/stat``
    cannot be read (not Linux). Measured around a latency measurement, it says whether other work shared the cores
    the timer needed: on a 2-core CPU beside two one-thread training processes (others: 1.2 cores), the latencies of
    ScaleFL's global and level-2 models (``scalefl-inference``) doubled and their ratio read 1.15-1.76x, against
    1.52-1.66x on the idle machine (others: at most 0.02 cores; ``costs.CLAIM_LATENCY``)."""

    cores: float | None = None

    def __enter__(self) -> OthersBusy:
        self._start = (_machine_busy_seconds(), time.process_time(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy0, own0, wall0 = self._start
        busy, own, wall = _machine_busy_seconds(), time.process_time(), time.perf_counter()
        if busy is not None and busy0 is not None:
            self.cores = max(0.0, (busy - busy0) - (own - own0)) / max(wall - wall0, 1e-9)


def _machine_busy_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU-seconds every process of the machine has computed since boot (``/proc/stat``), None where unreadable."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def describe(device) -> dict:
    """The device and the hardware and torch build that compute on it: the CPU's model, the instruction set torch's
    CPU kernels dispatch to (``torch.backends.cpu.get_cpu_capability``: AVX2, AVX512, ...) and its thread count; on
    CUDA the GPU's name too."""
    import torch  # here: report.py, torch-free, reads the segments with this module

    # str(): a TorchVersion does not load with weights_only
    out = {"device": str(device), "torch": str(torch.__version__), "cpu": cpu_model(),
           "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
           "threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def device_type(device) -> str:
    """``cuda`` for cuda:1 and cuda alike."""
    return str(device).split(":")[0]


def device_split(summary: dict) -> dict[str, tuple[float, int]]:
    """A run's wall seconds (``Simulation.elapsed``) and rounds per device type: each segment's, from the elapsed
    seconds and round at its start to the next one's, where the segments record both (runs since they do); else
    all on the summary's device (a summary without one is a CPU run's: every run before the field was one)."""
    wall, rounds = summary.get("wall_seconds") or 0.0, summary.get("rounds") or 0
    segments = summary.get("segments") or []
    if not (segments and all("device" in s and "elapsed_before" in s for s in segments)):
        return {device_type(summary.get("device", "cpu")): (wall, rounds)}
    split: dict[str, tuple[float, int]] = {}
    for segment, (end, last) in zip(segments, [(s["elapsed_before"], s["from_round"] - 1) for s in segments[1:]]
                                    + [(wall, rounds)]):
        seconds, done = split.get(device_type(segment["device"]), (0.0, 0))
        split[device_type(segment["device"])] = (seconds + end - segment["elapsed_before"],
                                                 done + last - segment["from_round"] + 1)
    return split


def device_seconds(summary: dict) -> dict[str, float]:
    """A run's wall seconds per device type (``device_split``)."""
    return {device: seconds for device, (seconds, _) in device_split(summary).items()}
