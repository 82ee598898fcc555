"""Where a message's time goes, end to end, for ``hetfl bench flower`` (torch-free: ClientApps and ServerApps use it).

A node's ClientApp (hetfl's shim, or the floor's) logs one line per ``train`` message, ``timing {JSON}``, with
the wall-clock times (``time.time()``, one clock on a loopback federation) at which the server created the
message, Flower started the ClientApp process, the app was called and its reply was made, plus the CPU seconds the
process had used by then; hetfl's shim adds the warm worker's times and phases. A ServerApp's ``grid.exchange``
logs when each reply reached it, to the file named by ``HETFL_EXCHANGE_LOG`` (set by the bench only). The bench
joins both by message id:

delivery (created -> started: SuperLink, SuperNode, the SuperExec's poll, the process spawn), ClientApp start
(started -> called: Python, Flower's imports, the message pulled, the app loaded), the app's work (called ->
replied; for the shim: to the worker, its phases, back), return (replied -> arrived: the reply pushed to the
SuperNode, the SuperLink, pulled by the server).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

EXCHANGE_LOG = "HETFL_EXCHANGE_LOG"  # a file each ServerApp's exchange appends its replies' arrivals to
TAG = "; timing "  # what precedes a ClientApp's timing JSON in its log line


def process_started() -> float | None:
    """When this process started (Linux: /proc), as ``time.time()`` reads; None where that cannot be read."""
    try:  # its start in clock ticks since boot, against the uptime now (btime, whole seconds, would be too coarse)
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def cpu_seconds() -> float:
    """The CPU seconds this process has used (user and system)."""
    return time.process_time()


class MessageClock:
    """A ClientApp's times for one message: made when the app is called, marked as it goes."""

    def __init__(self, message_id: str, created: float, round_label: str = ""):
        self.times: dict = {"message": message_id, "round": round_label, "created": created,
                            "started": process_started(), "called": time.time(), "cpu-called": cpu_seconds()}

    def mark(self, name: str) -> None:
        """Returns None; the time now (and the CPU used so far, as ``cpu-NAME``) is recorded as ``name``."""
        self.times[name] = time.time()
        self.times[f"cpu-{name}"] = cpu_seconds()

    def line(self) -> str:
        """The log line's tail: ``TAG`` and the times as JSON."""
        return TAG + json.dumps(self.times)


def log_arrival(message_id: str, pushed: float) -> None:
    """Returns None; appends a reply's arrival (now) to ``HETFL_EXCHANGE_LOG`` when it is set."""
    path = os.environ.get(EXCHANGE_LOG)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"message": message_id, "pushed": pushed, "arrived": time.time()}) + "\n")


def read_timings(lines: list[str]) -> list[dict]:
    """The timing JSON of each line of ``lines`` that carries one."""
    return [json.loads(line.split(TAG, 1)[1]) for line in lines if TAG in line]
