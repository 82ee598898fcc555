"""Flower's floor: the least a round on Flower costs, with hetfl's message sizes (``hetfl bench flower``).

A minimal Flower App, run on the same SuperLink and SuperNodes as hetfl's: its ServerApp sends every
node a ``train`` message holding arrays of the names, shapes and dtypes hetfl sends (no two alike) and
pulls the replies as hetfl's ServerApp does (``grid.exchange``); its ClientApp imports numpy, Flower
and two torch-free modules of hetfl's (``timing``, ``slots``) only, stands in for the training with
as much numpy work as a client's training (``work``, sized by ``units_for``), and replies with arrays
of the same sizes, its own (hetfl's FedAvg sends as much up as down). A round of it is what Flower
itself costs: a ClientApp process per message, the SuperNodes' polls, the messages on the wire.
hetfl's overhead per message is what a round of hetfl costs beyond it, over the messages of the round.

Why work and not a sleep: on one machine the nodes share its cores, and a client's training competes
for them with Flower's own processes (each message's ClientApp start-up); a sleeping stand-in would
not, and that contention would be counted as hetfl's. On a fleet of devices, one per node, the two
are the same. Why a fixed amount of work and not of CPU seconds: a training's CPU seconds grow when
the cores are shared or the machine has a slow minute (its tensors, tens of MB, fall out of the
caches); a stand-in that stops after fixed CPU seconds would not slow down with it, and the
difference would be counted as hetfl's. So the work is a training step's shape (a convolution's
im2col product forward and its weight gradient back, a working set of 19 MB) repeated a fixed number
of times, calibrated once on the bench's idle process to the CPU seconds of the simulator's training.
On a machine whose nodes outnumber its cores the work takes turns in the training slots (``slots``),
as hetfl's trainings do: ten stand-ins at once on two cores would thrash each other's caches, and a
floor slowed by that would flatter hetfl.

Its run config names ``spec``, a JSON file: ``nodes``, ``rounds``, ``work_units``, ``timeout``,
``arrays`` (name -> [shape, dtype]) and ``out``, where the ServerApp writes each round's seconds,
replies and bytes of the arrays that came back.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import zlib
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .baton import FLOOR, HETFL, Baton
from .grid import exchange
from .slots import training_slot
from .timing import MessageClock

server = ServerApp()
client = ClientApp()


@client.train()
def work_and_reply(msg: Message, context: Context) -> Message:
    """The reply to ``train``: after the training's work, arrays of the names, shapes and dtypes received, of this
    message's own (``distinct_arrays``): not an echo, which would never travel up (the SuperLink still holds it)."""
    clock = MessageClock(msg.metadata.message_id, msg.metadata.created_at, msg.metadata.group_id)
    with training_slot():  # the work takes turns as hetfl's trainings do (``slots``), not ten at once on two cores
        work(int(msg.content["config"]["work-units"]))
    received = msg.content["arrays"]
    base = 1 + len(received) * (1 + zlib.crc32(msg.metadata.message_id.encode()) % 65521)  # above the server's
    arrays = distinct_arrays({name: (array.shape, array.dtype) for name, array in received.items()}, base)
    reply = Message(RecordDict({"arrays": arrays}), reply_to=msg)
    clock.mark("replied")
    folder = Path(str(context.node_config["state-dir"]))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "floor.log", "a") as log:  # the bench reads it
        log.write(f"floor {os.getpid()}: replied{clock.line()}\n")
    return reply


def distinct_arrays(arrays: dict[str, tuple], base: int) -> ArrayRecord:
    """Arrays of the names, shapes and dtypes ``arrays`` gives (name -> (shape, dtype)), the k-th filled with
    ``base + k``. No two alike, as no two of a model's are: Flower's object stores keep one copy of each content
    (named by its SHA-256) and push only what the receiver lacks, even within one message, so arrays of zeros, or
    of one value, would travel as one per shape (27 objects a message where hetfl's CNN sends 49)."""
    return ArrayRecord({name: Array(np.full(shape, base + k, dtype=dtype))
                        for k, (name, (shape, dtype)) in enumerate(arrays.items())})


def work(units: int) -> None:
    """Returns None after ``units`` steps of a training-like workload (``step``)."""
    patches, weight = operands()
    for _ in range(units):
        step(patches, weight)


PATCHES, PATCH_SIZE, CHANNELS = 8192, 576, 64  # a 3x3 convolution over 64 channels, im2col form: 19 MB of patches


def operands() -> tuple[np.ndarray, np.ndarray]:
    """The patches and the weight of ``step``'s convolution."""
    return (np.full((PATCHES, PATCH_SIZE), 0.01, dtype=np.float32),
            np.full((PATCH_SIZE, CHANNELS), 0.01, dtype=np.float32))


def step(patches: np.ndarray, weight: np.ndarray) -> None:
    """Returns None; updates ``weight`` in place after a convolution's forward as an im2col product with a ReLU and
    its weight gradient (float32, on the threads numpy's BLAS is given)."""
    activations = np.maximum(patches @ weight, 0.0)
    weight -= 1e-6 * (patches.T @ activations)


def units_for(cpu_seconds: float, sample_seconds: float = 2.0) -> int:
    """The steps of ``work`` that take ``cpu_seconds`` of this process's CPU on this machine now: the median step's
    CPU time over about ``sample_seconds`` of steps (at least 5)."""
    patches, weight = operands()
    steps, sampled = [], time.process_time()
    while len(steps) < 5 or time.process_time() - sampled < sample_seconds:
        started = time.process_time()
        step(patches, weight)
        steps.append(time.process_time() - started)
    return max(1, round(cpu_seconds / statistics.median(steps)))


@server.main()
def rounds(grid: Grid, context: Context) -> None:
    """Returns None; runs the spec's rounds over every node and writes their seconds to the spec's ``out``; where
    the bench set a baton (``baton``), each round waits for its turn between hetfl's."""
    spec = json.loads(Path(str(context.run_config["spec"])).read_text())
    arrays = distinct_arrays(spec["arrays"], 1)  # one model for every node, as hetfl's: Flower stores it once
    deadline = time.monotonic() + spec["timeout"]
    while len(nodes := sorted(grid.get_node_ids())) < spec["nodes"] and time.monotonic() < deadline:
        time.sleep(0.5)
    baton = Baton.from_env()  # the bench's: hetfl's run and this one take turns round by round
    if baton:
        baton.give(HETFL)  # ready: hetfl's run starts, and its round 1 comes first
    seconds, replies, sizes = [], [], []
    for r in range(1, spec["rounds"] + 1):
        if baton:
            baton.wait_for(FLOOR, spec["timeout"])
        started = time.perf_counter()
        messages = {n: Message(RecordDict({"arrays": arrays, "config": ConfigRecord(
            {"work-units": spec["work_units"], "node": n})}), n, "train", ttl=spec["timeout"], group_id=str(r))
            for n in nodes}  # one content per node, as hetfl sends
        got = exchange(grid, messages, spec["timeout"])
        seconds.append(time.perf_counter() - started)
        replies.append(sum(not m.has_error() for m in got.values()))
        sizes.append(sum(len(a.data) for m in got.values() if m.has_content() for a in m.content["arrays"].values()))
        print(f"hetfl floor: round {r}/{spec['rounds']}: {replies[-1]} of {len(nodes)} replies in "
              f"{seconds[-1]:.2f} s", flush=True)
        if baton and r < spec["rounds"]:
            baton.give(HETFL)
    Path(spec["out"]).write_text(json.dumps({"seconds": seconds, "replies": replies, "bytes_up": sizes,
                                             "nodes": len(nodes)}))
