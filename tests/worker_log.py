"""Helpers the tests share to read a node's warm-worker log (``STATE_DIR/worker/worker.log``), to see the messages
waiting at a worker's socket and to find the processes a federation left."""

import os
import subprocess
from pathlib import Path


def worker_lines(folder: Path, words: str) -> list[str]:
    """The lines of the worker log in ``folder`` holding ``words`` (none before the log exists)."""
    log = Path(folder) / "worker.log"
    return [line for line in log.read_text().splitlines() if words in line] if log.exists() else []


def worker_pids(folder: Path) -> list[int]:
    """The pids of the workers that listened in ``folder``, in order."""
    return [int(line.split("worker ")[1].split(":")[0]) for line in worker_lines(folder, ": listening")]


def live_processes_in(folder: Path) -> list[str]:
    """The command lines of the live processes working in ``folder`` (or below): those a federation there started."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "stat").read_text().split(")")[-1].split()[0] == "Z":
                continue
            cwd = Path(os.readlink(proc / "cwd"))
            if cwd == folder or folder in cwd.parents:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def queued_at(pid: int) -> int:
    """How many connections wait, not yet accepted, at the listening Unix socket of process ``pid`` (``ss``'s
    Recv-Q; a worker binds its socket through a folder's fd when the path is long, so its address is not its path)."""
    out = subprocess.run(["ss", "-xlpH"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[2]) for line in out.splitlines() if f"pid={pid}," in line)
