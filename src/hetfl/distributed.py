"""One run over several processes with ``torch.distributed``: who is who, the exchange, the watchdog, the launcher.

A run of N processes is N copies of the same simulation (DESIGN.md, "Performance"): every rank
samples, plans and cuts the same jobs, trains its share of them (``executors.distributed``), and
receives every other rank's replies in job order, so every rank aggregates the same updates in the
same order and holds bit-identically the same global model, whatever N is. Evaluation is shared the
same way (``Simulation.evaluate``). Rank 0 owns the run folder; the other ranks write nothing.

Choices, and why:

* **gloo on every device.** What the ranks exchange are pickled replies (tensors moved to the
  CPU, so a rank on ``cuda:1`` can read one made on ``cuda:0``) and small tallies, never a
  collective over GPU tensors; NCCL would add nothing to that and refuses two ranks on one GPU,
  which pfl-research's finding (several processes per GPU pay) needs.
* **A watchdog, not the collective timeout.** A rank that waits at a gather for a slower one is
  working as intended (a round's shares differ), so collectives get a long backstop timeout
  (``COLLECTIVE_TIMEOUT``) and lost ranks are found by heartbeats: every rank adds to its counter
  in the rendezvous store every second and reads the others'; a counter that stands still for
  ``--rank-timeout`` seconds (default ``RANK_TIMEOUT``), or a store that stops answering, ends
  the process with one line naming the rank. A killed rank is found the same way (its peers' next
  exchange fails at once, and then waits for the verdict), a stopped (hung) one too.
* **The launcher.** ``hetfl run --processes N`` starts N copies of its own command with the
  environment ``torchrun`` gives (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so a
  run started either way is the same; it waits for them, and when one fails it gives the others
  the watchdog's time to say so, then stops them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from .errors import HetflError
from .machine import threads_each
from .ports import free_port

RANK_TIMEOUT = 20.0  # seconds a rank's heartbeat may stand still before it counts as lost
COLLECTIVE_TIMEOUT = timedelta(hours=24)  # a backstop only: waiting for a slower rank is normal (the watchdog judges)
HEARTBEAT = 1.0  # seconds between a rank's heartbeats
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Team:
    """The processes of one run: this one's rank among ``size``; one process alone is a team of one, for which every
    exchange is the identity (so the engine has one code path)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    watchdog: Watchdog | None = field(default=None, repr=False)

    @property
    def owner(self) -> bool:
        """Whether this process owns the run folder (rank 0)."""
        return self.rank == 0

    def share(self, n: int) -> range:
        """This rank's contiguous part of ``range(n)``: parts in rank order, sizes differing by at most one."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def gather(self, obj):
        """Every rank's ``obj``, in rank order (tensors come back on the CPU from other ranks)."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        self._collective(torch.distributed.all_gather_object, out, to_cpu(obj))
        return out

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (tensors on the CPU)."""
        if self.size == 1:
            return obj
        box = [to_cpu(obj) if self.owner else None]
        self._collective(torch.distributed.broadcast_object_list, box, src=0)
        return box[0]

    def scatter(self, objs: list | None):
        """Rank 0's ``objs[r]`` on rank r (``objs`` is read on rank 0 only)."""
        if self.size == 1:
            return objs[0]
        box = [None]
        self._collective(torch.distributed.scatter_object_list, box, [to_cpu(o) for o in objs] if self.owner else None,
                         src=0)
        return box[0]

    def _collective(self, op, *args, **kwargs) -> None:
        """Runs ``op``; when a peer is lost mid-exchange, waits for the watchdog to name it (it ends the process)."""
        try:
            op(*args, **kwargs)
        except RuntimeError as e:  # gloo's errors (DistBackendError) when a peer closed its connection or timed out
            if self.watchdog is not None:
                self.watchdog.await_verdict()
            raise HetflError(f"rank {self.rank}: the exchange with the other ranks failed ({_first_line(e)})") from None

    def device(self, device: torch.device) -> torch.device:
        """This rank's device: ``cuda`` without an index becomes ``cuda:LOCAL_RANK mod #GPUs`` (ranks may share one)."""
        if device.type == "cuda" and device.index is None and self.size > 1:
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return device

    def agree(self, facts: dict[str, object]) -> None:
        """Returns None; raises HetflError on every rank when some rank's ``facts`` (its options, versions, data
        checksum: name -> value) differ from rank 0's, naming the first such rank and fact."""
        every = self.gather(facts)
        for rank, theirs in enumerate(every):
            for key, value in every[0].items():
                if theirs.get(key) != value:
                    raise HetflError(f"rank {rank}'s {key} differs from rank 0's ({_short(theirs.get(key))} against "
                                     f"{_short(value)}); start every rank with the same command, data and hetfl")

    def close(self) -> None:
        """Returns None; leaves the process group after a last barrier, so no rank leaves one still exchanging (the
        end of a run that went well)."""
        if self.size > 1 and torch.distributed.is_initialized():
            self._collective(torch.distributed.barrier)
        self.leave()

    def leave(self) -> None:
        """Returns None; stops the watchdog and leaves the process group at once, on any way out of a run (idempotent).
        The watchdog's thread must have ended before the interpreter does: a daemon thread caught inside the store's
        C++ code when Python finalizes aborts the process (``terminate called without an active exception``)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def launched() -> bool:
    """Whether this process was started as one rank of several (by ``torchrun`` or ``hetfl run --processes``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join(rank_timeout: float = RANK_TIMEOUT) -> Team:
    """This process's team: a team of one unless a launcher started it as a rank of several, then joined to its
    peers (gloo) with a watchdog judging them lost after ``rank_timeout`` silent seconds."""
    if not launched():
        return Team()
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as e:
        raise HetflError(f"WORLD_SIZE is set but the launcher's environment is incomplete or wrong ({e}); start the "
                         f"processes with torchrun or hetfl run --processes, which set {', '.join(LAUNCH_ENV)}"
                         ) from None
    torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=size,
                                         timeout=COLLECTIVE_TIMEOUT)
    watchdog = Watchdog(rank, size, address, port, rank_timeout)
    watchdog.start()
    return Team(rank, size, local_rank, watchdog)


class Watchdog(threading.Thread):
    """Heartbeats in the rendezvous store: ends this process with one line when a peer's counter stands still for
    ``timeout`` seconds or the store stops answering (the rank holding it is gone)."""

    def __init__(self, rank: int, size: int, address: str, port: int, timeout: float):
        super().__init__(name="hetfl-watchdog", daemon=True)
        self.rank, self.size, self.timeout = rank, size, timeout
        self.store = torch.distributed.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=timeout),
                                                wait_for_workers=False)
        self.stopped = threading.Event()

    def run(self) -> None:
        """The heartbeat loop: beat, read the others, judge."""
        last: dict[int, tuple[int, float]] = {}
        while not self.stopped.wait(HEARTBEAT):
            now = time.monotonic()
            try:
                self.store.add(f"hetfl/beat/{self.rank}", 1)
                beats = {r: self.store.add(f"hetfl/beat/{r}", 0) for r in range(self.size) if r != self.rank}
            except Exception as e:  # noqa: BLE001 (the store's errors have no common type but RuntimeError's kin)
                if self.stopped.is_set():
                    return
                self.die(f"lost the rendezvous store held by rank 0 or the launcher ({_first_line(e)})")
            for r, beat in beats.items():
                if r not in last or last[r][0] != beat:
                    last[r] = (beat, now)
                elif now - last[r][1] > self.timeout:
                    self.die(f"lost rank {r}: it sent no heartbeat for {self.timeout:g} s (killed or hung)")

    def die(self, why: str) -> None:
        """Ends this process (exit 1) with one line; the run folder keeps its last checkpoint."""
        if self.stopped.is_set():
            return
        print(f"hetfl: error: rank {self.rank}: {why}; the run folder keeps its last checkpoint: continue it with "
              "hetfl run --resume RUN_DIR", file=sys.stderr, flush=True)
        os._exit(1)

    def await_verdict(self) -> None:
        """Returns None after the time the watchdog needs to judge a lost peer (it ends the process before, if so)."""
        time.sleep(self.timeout + 3 * HEARTBEAT)

    def stop(self) -> None:
        """Returns None once the heartbeat thread has ended (at most the store's timeout, when its last call hangs)."""
        self.stopped.set()
        if self.is_alive():
            self.join(self.timeout + 2 * HEARTBEAT)


def to_cpu(obj):
    """``obj`` with every tensor it holds (in dicts, lists, tuples, dataclasses' fields) moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def checksum(*tensors: torch.Tensor) -> str:
    """A SHA-256 of the tensors' values, shapes and dtypes (what ranks compare to know they hold the same data)."""
    digest = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        digest.update(f"{tuple(t.shape)} {t.dtype};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


# ---- the launcher ----------------------------------------------------------------------------
def launch(processes: int, argv: list[str], rank_timeout: float = RANK_TIMEOUT) -> int:
    """Runs ``hetfl ARGV`` as ``processes`` ranks on this machine (each with cores / processes threads unless
    OMP_NUM_THREADS says otherwise) and returns the exit code: 0, or the first failed rank's. When a rank fails,
    the others get the watchdog's time to end with their own line, and are then stopped."""
    port = free_port()
    threads = str(threads_each(processes))
    children = []
    for rank in range(processes):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": threads}
        children.append(subprocess.Popen([sys.executable, "-m", "hetfl", *argv], env=env))
    failed: tuple[int, int] | None = None  # (rank, exit code) of the first rank that failed
    deadline = None
    try:
        while True:
            codes = [c.poll() for c in children]  # one scan: ranks that end together are all judged before leaving
            for rank, code in enumerate(codes):
                if failed is None and code not in (None, 0):
                    failed, deadline = (rank, code), time.monotonic() + rank_timeout + 5 * HEARTBEAT
                    if code < 0:
                        print(f"hetfl: error: rank {rank} was killed by signal {-code}; stopping the others",
                              file=sys.stderr, flush=True)
            if None not in codes:
                break
            if deadline is not None and time.monotonic() > deadline:
                for c in children:
                    if c.poll() is None:
                        c.kill()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGINT)
        for c in children:
            c.wait()
        raise
    if failed is not None:
        return failed[1] if failed[1] > 0 else 1
    return 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
