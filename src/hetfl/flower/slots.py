"""Training slots: at most as many of a machine's SuperNodes train at once as its cores can run.

A loopback federation (``hetfl deploy``, ``hetfl bench flower``) runs every SuperNode on one machine:
10 nodes on 2 cores trained 10 models at once, each preempting the others, and a training took
2.76 CPU-s (median, up to 3.41) where the simulator's took 2.52, its caches cold at every switch
(``hetfl bench flower``'s warm workers). With slots, a training waits for one of ``cores // threads``
slots instead: 2.54 CPU-s, and the replies travel while the next trainings run. On a fleet (one
device per node) no slots are set and nothing waits.

A ``Federation`` whose nodes outnumber its slots sets ``SLOTS_ENV`` (how many) and ``SLOTS_DIR_ENV`` (a
folder of lock files, one per slot) for every process it starts; a training holds an exclusive
``flock`` on one of the files, which the kernel releases when its process ends, however it ends.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

SLOTS_ENV, SLOTS_DIR_ENV = "HETFL_TRAINING_SLOTS", "HETFL_TRAINING_SLOTS_DIR"
RETRY_SECONDS = 0.01  # between sweeps over the slots while all are taken


@contextmanager
def training_slot():
    """A block that holds one of the machine's training slots (waiting for one), or any block when none are set."""
    count, folder = os.environ.get(SLOTS_ENV), os.environ.get(SLOTS_DIR_ENV)
    if not count or not folder:
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    with ExitStack() as files:
        slots = [files.enter_context(open(Path(folder) / f"slot-{k}", "a")) for k in range(int(count))]
        while (held := _take_one(slots)) is None:
            time.sleep(RETRY_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _take_one(slots: list):
    """The first of ``slots`` (open files) locked now for this process, or None when every one is held."""
    for slot in slots:
        try:
            fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot
        except BlockingIOError:
            continue
    return None
