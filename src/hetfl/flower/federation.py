"""A Flower federation on one machine: a SuperLink and SuperNodes on free loopback ports, as child processes.

Each process runs in its own process group (so the ClientApp and ServerApp processes Flower
starts under it go with it) and logs to ``ROOT/logs``; ``stop`` (and leaving the ``with`` block,
whatever happened) sends SIGTERM to every group and SIGKILL to what is left after a grace period.
Flower's own settings are kept inside ``ROOT``: its home (``FLWR_HOME``: the CLI's connection to
this SuperLink, the installed app), the credentials. Runtime dependency installation is off: the
app runs in this Python environment, with this torch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import HetflError
from ..machine import cores
from ..ports import free_port
from .credentials import make_node_key, make_tls
from .slots import SLOTS_DIR_ENV, SLOTS_ENV

CONNECTION = "hetfl"  # the name of this SuperLink in the Flower CLI's config
GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL when stopping
GONE_SECONDS = 2.0  # for the members of the killed groups to be torn down
RESTART_SECONDS = 5.0  # a node that dies is started again, but not sooner than this after its last start
START_SECONDS = 60.0  # for the SuperLink to listen
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
POLL_CPU_SECONDS = 0.005  # measured (flwr 1.41, 2 cores): one poll of a SuperExec costs it and its SuperNode this
POLL_SHARE = 0.05  # of this machine's cores that the polls of all its SuperNodes may use together


def poll_interval(nodes: int, cores: int) -> float:
    """Seconds between a SuperExec's polls of its SuperNode for work to start (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``)
    when ``nodes`` SuperNodes share ``cores`` cores: as short as 0.05 s (each message waits for a poll before its
    ClientApp starts; Flower's default, 1 s, adds up to a second to each), but long enough that all the polls stay
    under ``POLL_SHARE`` of the machine. Polling every 0.05 s, 10 SuperNodes on 2 cores burned 1.18 cores while
    idle (measured: SuperNodes 0.68, SuperExecs 0.36, SuperLink 0.14), and every round on them took twice as long
    as its work."""
    return round(min(1.0, max(0.05, nodes * POLL_CPU_SECONDS / (POLL_SHARE * cores))), 3)


def node_threads(nodes: int, cores: int) -> int:
    """The threads each of ``nodes`` SuperNodes' processes may compute with on ``cores`` cores (``OMP_NUM_THREADS``,
    which torch and numpy read): their fair share, at least one; more would make their trainings preempt each
    other."""
    return max(1, cores // nodes)


def flower_bin(name: str) -> str:
    """The path of Flower's command ``name`` in this Python environment; HetflError when Flower is missing."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise HetflError(f"Flower's {name} is not installed in this environment; pip install 'hetfl[flower]'")
    return str(path)


def check_installed() -> None:
    """Returns None; HetflError unless Flower's commands are installed in this environment."""
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        flower_bin(name)


def config_string(values: dict) -> str:
    """``values`` as Flower's ``key=value ...`` config string (strings quoted)."""
    parts = []
    for key, value in values.items():
        if isinstance(value, str):
            if '"' in value or "\\" in value:
                raise HetflError(f"{key} {value!r} cannot hold a quote or a backslash in a Flower config")
            value = f'"{value}"'
        elif isinstance(value, bool):
            value = str(value).lower()
        parts.append(f"{key}={value}")
    return " ".join(parts)


class Federation:
    """A SuperLink and its SuperNodes on loopback, with TLS and SuperNode authentication on request (``env``: more
    environment variables for every process). ``nodes``: how many SuperNodes will share this machine, which sets
    how often each polls for work (``poll_interval``), unless ``OMP_NUM_THREADS`` is set the threads each trains
    with (``node_threads``), and how many may train at once (``slots``)."""

    def __init__(self, root: Path, tls: bool = False, node_auth: bool = False, env: dict | None = None,
                 nodes: int = 1):
        self.root = Path(root)
        self.node_auth = node_auth
        self.tls = make_tls(self.root / "tls") if tls or node_auth else None  # Flower authenticates nodes over TLS
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, tuple[list[str], subprocess.Popen, float]] = {}  # name -> command, process, started
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        machine = cores()
        threads = os.environ.get("OMP_NUM_THREADS") or str(node_threads(nodes, machine))
        shared = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(poll_interval(nodes, machine)), "OMP_NUM_THREADS": threads}
        slots = max(1, machine // (int(threads) if threads.isdigit() and int(threads) > 0 else 1))
        if nodes > slots:  # more nodes than the cores run at once: their trainings take turns (``slots``)
            shared |= {SLOTS_ENV: str(slots), SLOTS_DIR_ENV: str(self.root / "slots")}
        self.env = {**os.environ, **FLOWER_ENV, **shared, "FLWR_HOME": str(self.root / "home"),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}

    @property
    def address(self) -> str:
        """The SuperLink's address (all of its APIs: Fleet, Control, ServerApp runtime)."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Federation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Returns None; starts the SuperLink, waits for it to listen and points the Flower CLI at it."""
        command = [flower_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                   "--disable-runtime-dependency-installation", *self._server_tls()]
        if self.node_auth:
            command.append("--enable-supernode-auth")
        self.superlink = self._spawn("superlink", command)
        deadline = time.monotonic() + START_SECONDS
        while not _listening(self.port):
            if self.superlink.poll() is not None or time.monotonic() > deadline:
                raise HetflError(f"the SuperLink did not start; see {self.log('superlink')}")
            time.sleep(0.1)
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        security = f'root-certificates = "{self.tls.ca}"' if self.tls else "insecure = true"
        (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                          f'address = "{self.address}"\n{security}\n')

    def _server_tls(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls.ca), "--ssl-certfile", str(self.tls.cert),
                "--ssl-keyfile", str(self.tls.key)]

    def add_node(self, name: str, node_config: dict, registered: bool = True) -> subprocess.Popen:
        """A started SuperNode with ``node_config``; with node authentication it gets a key of its own, which is
        put on the SuperLink's list unless ``registered`` is False (such a node is refused)."""
        command = [flower_bin("flower-supernode"), "--superlink", self.address, "--host", "127.0.0.1",
                   "--port", str(free_port()), "--node-config", config_string(node_config)]
        command += ["--root-certificates", str(self.tls.ca)] if self.tls else ["--insecure"]
        if self.node_auth:
            private, public = make_node_key(self.root / "keys", name)
            if registered:
                self.flwr("supernode", "register", str(public), CONNECTION)
            command += ["--auth-supernode-private-key", str(private)]
        process = self._spawn(f"node-{name}", command)
        self.nodes[name] = (command, process, time.monotonic())
        return process

    def restart_dead_nodes(self) -> list[str]:
        """The names of the SuperNodes that had exited and were started again (same command and key, a port of
        their own again: the old one may be what it died of, taken by another process); a node that keeps dying
        is started at most every ``RESTART_SECONDS``."""
        restarted = []
        for name, (command, process, started) in self.nodes.items():
            if process.poll() is not None and time.monotonic() - started >= RESTART_SECONDS:
                _signal_group(process, signal.SIGKILL)  # what it left behind
                command = _on_fresh_port(command)
                self.nodes[name] = (command, self._spawn(f"node-{name}", command), time.monotonic())
                restarted.append(name)
        return restarted

    def flwr(self, *args: str) -> str:
        """The output of the Flower CLI command ``flwr ARGS`` against this SuperLink; HetflError if it fails."""
        done = subprocess.run([flower_bin("flwr"), *args], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise HetflError(f"flwr {' '.join(args[:2])} failed: {' '.join((done.stderr or done.stdout).split())}")
        return done.stdout

    def run_app(self, app_dir: Path, run_config: dict) -> subprocess.Popen:
        """A started ``flwr run APP --stream`` of the Flower App in ``app_dir``: its output is the run's log."""
        command = [flower_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream",
                   "--run-config", config_string(run_config)]
        return self._started(command, stdout=subprocess.PIPE, text=True)

    def log(self, name: str) -> Path:
        """The log file of the process called ``name``."""
        return self.root / "logs" / f"{name}.log"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        with open(self.log(name), "a") as log:
            return self._started(command, stdout=log)

    def _started(self, command: list[str], **popen) -> subprocess.Popen:
        """A started process in a group of its own, recorded for ``stop`` before an interrupt can land: a Ctrl-C
        inside ``Popen`` (after the fork, before it returns) would leave a child that nothing stops."""
        with _signals_deferred():
            process = subprocess.Popen(command, env=self.env, cwd=self.root, stderr=subprocess.STDOUT,
                                       start_new_session=True, **popen)
            self.procs.append(process)
        return process

    def stop(self) -> None:
        """Returns None; stops every process this federation started, and whatever they started."""
        for process in reversed(self.procs):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for process in self.procs:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process, signal.SIGKILL)  # also the children a graceful exit left behind
            process.wait()
            if process.stdout:
                process.stdout.close()
        _wait_gone([process.pid for process in self.procs], time.monotonic() + GONE_SECONDS)
        self.procs.clear()


def _on_fresh_port(command: list[str]) -> list[str]:
    """``command`` with the value of its ``--port`` replaced by a free port."""
    at = command.index("--port") + 1
    return [*command[:at], str(free_port()), *command[at + 1:]]


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """Returns None; sends ``sig`` to the process group ``process`` leads (gone already: nothing to do)."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(groups: list[int], deadline: float) -> None:
    """Returns None once no process is left in ``groups`` (SIGKILL is delivered asynchronously: a killed
    leader's children may linger a moment under load), or at ``deadline``."""
    for group in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.02)


@contextmanager
def _signals_deferred():
    """Ctrl-C and SIGTERM held back until the block ends, then delivered to the handlers they were meant for
    (Python sets signal handlers in the main thread only: elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
