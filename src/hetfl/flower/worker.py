"""A node's warm worker: one long-lived hetfl process that trains the node's ``train`` messages.

Flower 1.41 runs every message in a new ClientApp process (supercore/superexec/executor/
subprocess_executor.py: one ``Popen`` per task), so a cold ClientApp imports torch, loads its data
and builds its model for every message: seconds of CPU before it trains, more on a phone-class
device. The worker keeps all three (``node.NodeTrainer``); hetfl's ClientApp becomes a shim
(``ask``) that hands the message's content to it over a Unix socket and returns its reply, and
imports neither torch nor the rest of hetfl.

* Start and end: the first message's shim starts the worker, in the SuperNode's process group, so
  whatever stops the SuperNode's group stops it; it also exits by itself once its owner, the
  SuperNode's SuperExec (the process that starts the ClientApps), is gone. One worker per owner:
  its socket is named after the owner's pid and hetfl's version (an upgraded hetfl never talks to
  an old worker).
* Safety: the socket lives in ``STATE_ROOT/worker``, a folder only the node's user may enter
  (created 0700; a folder or socket that is not the user's own, or is open to others, is refused
  before anything is sent), and the worker serves no peer whose uid is not its own (SO_PEERCRED).
* Failure: a worker that dies while it trains (its connection breaks) or does not reply within
  the message's TTL (it is then killed) makes the shim answer with Flower's CLIENT_APP_CRASHED
  error: the server records the client as missing, as for a lost reply, and the round goes on. The
  next message finds the stale socket, removes it and starts a new worker. A worker that dies
  before it takes a message loses nothing: its listener, while the kernel tears it down, can still
  queue a connection and then reset it, so the shim hands the message over only once the worker
  says it has taken the connection, and otherwise asks again (a new worker, once the old is gone).
  A worker whose training raises replies with the error, which the shim raises (the server records
  the client's failure).
* Results: the worker trains with the same ``NodeTrainer`` as a cold ClientApp and reads the
  client's own state from the node's disk for every message, so its replies are the same tensors.

Protocol: length-prefixed frames (an 8-byte big-endian length, then the bytes), one message per
connection: the worker's ``TAKEN`` once it has accepted it; the request, a JSON header, then a RecordDict
as Flower's protobuf; the reply, the same two.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from .. import __version__
from ..errors import HetflError
from .timing import MessageClock

FRAME = struct.Struct(">Q")
TAKEN = b"taken"  # the worker's first frame on a connection it has accepted
RETRY_SECONDS = 0.05  # between tries to reach a worker that was gone before it took the message
START_SECONDS = 120.0  # for a new worker to listen (it imports torch first: seconds on a loaded machine)
OWNER_POLL_SECONDS = 1.0  # how often a worker checks that its owner still runs
UNIX_PATH_MAX = 100  # a socket path longer than this (sun_path holds 108 bytes) is reached through its folder's fd


class WorkerLost(Exception):
    """The worker died, or did not reply in time, while it had the message: no reply, as for a lost one."""


class WorkerFailed(RuntimeError):
    """The worker's training raised; the message is the error it replied with."""


# ---- the shim's side (in the ClientApp process: no torch) ----------------------------------------------------------
def ask(node_config: dict, state_root: Path, content: RecordDict, timeout: float, label: str = "",
        owner: int | None = None, clock: MessageClock | None = None) -> RecordDict:
    """The worker's reply content to a ``train`` message's ``content``, started first if none runs for this node;
    WorkerLost if it dies or has not replied within ``timeout`` seconds, WorkerFailed if its training raised,
    HetflError if the worker folder is not private or a new worker cannot start. ``label`` names the message in
    the worker's log; ``owner``: the process whose end ends the worker (default: the SuperExec that started this
    ClientApp); ``clock``: the message's times (``timing``), completed here with the worker's and logged."""
    folder = private_folder(state_root)
    owner = owner or os.getppid()
    deadline = time.monotonic() + timeout
    while True:
        sock = connect(folder, owner) or start(folder, owner, deadline)
        with sock:
            pid = peer_pid(sock)
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                if _taken(sock):
                    return _exchange(sock, pid, folder, f"shim {os.getpid()}: {label}", node_config, content, clock)
            except TimeoutError:
                if pid:
                    _kill(pid)  # a hung worker would hang every later message too
                raise WorkerLost(f"(pid {pid}) did not reply within the message's time to live ({timeout:.0f} s); "
                                 "it was stopped") from None
            except (ConnectionError, OSError) as e:
                raise WorkerLost(f"(pid {pid}) died while it trained ({type(e).__name__})") from None
        log(folder, f"shim {os.getpid()}: {label}: worker {pid} was gone before it took the message")
        if time.monotonic() + RETRY_SECONDS >= deadline:
            raise WorkerLost(f"(pid {pid}) was gone, and no new worker took the message within its time to live "
                             f"({timeout:.0f} s)")
        time.sleep(RETRY_SECONDS)  # its listener may queue (and reset) another connection meanwhile


def _exchange(sock: socket.socket, pid: int | None, folder: Path, shim: str, node_config: dict, content: RecordDict,
              clock: MessageClock | None) -> RecordDict:
    """The reply content of the worker ``pid`` that took ``sock``, to the request it is sent now; WorkerFailed if its
    training raised. ``shim`` names this shim and message in the worker's log."""
    log(folder, f"{shim}: handed to worker {pid}")
    if clock is not None:
        clock.mark("handed")
    send_frame(sock, json.dumps({"node": node_config}).encode())
    send_frame(sock, recorddict_to_proto(content).SerializeToString())
    header = json.loads(recv_frame(sock))
    if "error" in header:
        raise WorkerFailed(header["error"])
    reply = parse_content(recv_frame(sock))
    if clock is not None:
        clock.mark("replied")
        clock.times["worker"] = header  # when it took the message and replied, and its phases
        log(folder, f"{shim}: replied{clock.line()}")
    return reply


def _taken(sock: socket.socket) -> bool:
    """Whether the worker took the connection (sent TAKEN); False if it closed or reset it first (it died); a
    TimeoutError if it says nothing before the socket's timeout (hung, or still busy with an earlier message)."""
    try:
        return recv_frame(sock) == TAKEN
    except TimeoutError:
        raise
    except (ConnectionError, OSError):
        return False


def private_folder(state_root: Path) -> Path:
    """``STATE_ROOT/worker``, created 0700; HetflError if it is not a folder of this user's that only they may
    enter (another user could then read the messages or pose as the worker)."""
    folder = Path(state_root) / "worker"
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise HetflError(f"the worker folder {folder} must be a folder of this user's that only they may enter "
                         f"(owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it, or chmod 700 it "
                         "if it is yours")
    return folder


def socket_path(folder: Path, owner: int) -> Path:
    """The socket of the worker that serves the ClientApps of SuperExec ``owner``."""
    return folder / f"{owner}-{__version__}.sock"


def connect(folder: Path, owner: int) -> socket.socket | None:
    """A connection to the worker of ``owner``, or None when none listens there (no socket, or a stale one);
    HetflError when the socket is not this user's."""
    path = socket_path(folder, owner)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise HetflError(f"{path} is not a socket of this user's; refusing to send it the node's work")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _address(path) as address:
            sock.connect(address)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    return sock


def start(folder: Path, owner: int, deadline: float) -> socket.socket:
    """A connection to a worker of ``owner`` started now (unless another shim just did); HetflError if it exits
    or does not listen by ``deadline`` (at most START_SECONDS from now)."""
    with _locked(folder / "start.lock"):
        sock = connect(folder, owner)
        if sock is not None:
            return sock
        socket_path(folder, owner).unlink(missing_ok=True)  # stale: its worker died without removing it
        with open(folder / "worker.log", "a") as out:
            process = subprocess.Popen([sys.executable, "-m", "hetfl.flower.worker", str(folder), str(owner)],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        end = min(deadline, time.monotonic() + START_SECONDS)
        while (sock := connect(folder, owner)) is None:
            if process.poll() is not None or time.monotonic() > end:
                _kill(process.pid)
                raise HetflError(f"the node's worker {'exited' if process.returncode is not None else 'did not listen'}"
                                 f" at its start; see {folder / 'worker.log'}")
            time.sleep(0.05)
        return sock


def parse_content(data: bytes) -> RecordDict:
    """A RecordDict from its serialised protobuf."""
    proto = RecordDictProto()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)


def send_frame(sock: socket.socket, data: bytes) -> None:
    """Returns None; sends ``data`` as one frame."""
    sock.sendall(FRAME.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> bytes:
    """One frame's bytes; ConnectionError if the peer closes first."""
    (size,) = FRAME.unpack(_recv_exactly(sock, FRAME.size))
    return _recv_exactly(sock, size)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (Linux), else None."""
    return _peer_credentials(sock)[0]


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux), else None."""
    return _peer_credentials(sock)[1]


def _peer_credentials(sock: socket.socket) -> tuple[int | None, int | None]:
    if not hasattr(socket, "SO_PEERCRED"):
        return None, None
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def log(folder: Path, line: str) -> None:
    """Returns None; appends a time-stamped line to the node's worker log."""
    with open(folder / "worker.log", "a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def _address(path: Path):
    """``path`` as a socket address: itself, or (too long for sun_path, Linux) through an fd of its folder."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


@contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` for the block (two shims must not both start a worker)."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---- the worker's side --------------------------------------------------------------------------------------------
def serve(folder: Path, owner: int) -> None:
    """Returns never (the process ends once ``owner`` is gone); trains every request that reaches the socket, one
    at a time."""
    from .node import NodeTrainer  # torch and hetfl, once: what the shims no longer import per message

    path = socket_path(folder, owner)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path.with_name(f".{os.getpid()}.sock")
    with _address(staging) as address:
        listener.bind(address)
    listener.listen(8)
    os.replace(staging, path)  # shims see the socket only once it accepts connections
    threading.Thread(target=_exit_with, args=(owner, path), daemon=True).start()
    import torch

    threads = torch.get_num_threads()  # OMP_NUM_THREADS, which a Federation sets from its nodes per core
    log(folder, f"worker {os.getpid()}: listening for the ClientApps of {owner}, training with {threads} torch "
        f"thread{'s' if threads > 1 else ''}")
    trainers: dict[str, NodeTrainer] = {}
    while True:
        conn, _ = listener.accept()
        with conn:
            handle(conn, folder, trainers)


def handle(conn: socket.socket, folder: Path, trainers: dict) -> None:
    """Returns None; answers the request on ``conn`` (a peer of another user gets nothing), training with the
    node's ``NodeTrainer`` in ``trainers`` (made on its first request)."""
    from .identity import NodeIdentity
    from .node import NodeTrainer

    if peer_uid(conn) not in (None, os.getuid()):
        log(folder, f"worker {os.getpid()}: refused a connection from uid {peer_uid(conn)}")
        return
    accepted, started = time.time(), time.perf_counter()
    try:
        send_frame(conn, TAKEN)
        header = json.loads(recv_frame(conn))
        received = time.perf_counter()
        content = parse_content(recv_frame(conn))
    except (ConnectionError, OSError, ValueError):
        return  # the shim went away before it sent its request
    parsed = time.perf_counter()
    try:
        key = json.dumps(header["node"], sort_keys=True)
        if key not in trainers:
            trainers[key] = NodeTrainer(NodeIdentity.from_config(header["node"]))
        ready = time.perf_counter()
        answer = trainers[key].train(content)
        trained = time.perf_counter()
        reply = recorddict_to_proto(answer).SerializeToString()
    except Exception as e:  # noqa: BLE001 -- the shim raises it, as a cold ClientApp would
        message = f"{type(e).__name__}: {e}"
        log(folder, f"worker {os.getpid()}: failed: {message}")
        _send_quietly(conn, json.dumps({"error": message}).encode())
        return
    done = time.perf_counter()
    # where a warm message's time goes (the shim's timing line carries them to ``bench flower``): the request's
    # frames, the node's trainer made (first message), its phases (``NodeTrainer.phases``), the reply's protobuf
    phases = {"header": received - started, "receive+parse": parsed - received, "setup": ready - parsed,
              **trainers[key].phases, "serialise": done - trained}
    _send_quietly(conn, json.dumps({"accepted": accepted, "done": time.time(), "phases": phases}).encode(), reply)
    phases["reply"] = time.perf_counter() - done
    log(folder, f"worker {os.getpid()}: trained in {done - started:.2f} s; phases "
        + json.dumps({k: round(v, 4) for k, v in phases.items()}))


def _send_quietly(conn: socket.socket, *frames: bytes) -> None:
    """Returns None; sends ``frames`` unless the shim has gone (its message then ended without this reply)."""
    try:
        for frame in frames:
            send_frame(conn, frame)
    except OSError:
        pass


def _exit_with(owner: int, path: Path) -> None:
    """Returns never; ends the worker (removing its socket) once ``owner`` has exited."""
    while True:
        try:
            os.kill(owner, 0)
        except (ProcessLookupError, PermissionError):  # gone (or its pid is another user's process now)
            path.unlink(missing_ok=True)
            os._exit(0)
        time.sleep(OWNER_POLL_SECONDS)


def main(argv: list[str] | None = None) -> None:
    """``python -m hetfl.flower.worker FOLDER OWNER``: the worker, as a shim starts it; a Ctrl-C or SIGTERM to the
    SuperNode's group ends it quietly, its socket removed."""
    folder, owner = (argv or sys.argv[1:])[:2]
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        serve(Path(folder), int(owner))
    except KeyboardInterrupt:
        socket_path(Path(folder), int(owner)).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
