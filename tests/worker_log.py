"""Helpers the tests share to read a node's warm-worker log (``STATE_DIR/worker/worker.log``)."""

from pathlib import Path


def worker_lines(folder: Path, words: str) -> list[str]:
    """The lines of the worker log in ``folder`` holding ``words`` (none before the log exists)."""
    log = Path(folder) / "worker.log"
    return [line for line in log.read_text().splitlines() if words in line] if log.exists() else []


def worker_pids(folder: Path) -> list[int]:
    """The pids of the workers that listened in ``folder``, in order."""
    return [int(line.split("worker ")[1].split(":")[0]) for line in worker_lines(folder, ": listening")]
