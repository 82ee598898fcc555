"""``hetfl deploy``: one experiment on Flower, with a SuperLink and a SuperNode per client on loopback.

It creates the run folder (the same as ``hetfl run``'s, set up and checked the same way, before
any process starts), starts the federation under ``RUN_DIR/flower`` (logs, Flower's home, the
credentials, each node's own disk ``node-K``), runs hetfl's Flower App on it with ``flwr run``,
shows the ServerApp's progress lines and ends with the run's summary table. Every process it
started is stopped when the run ends, fails, or is interrupted (Ctrl-C, SIGTERM). A SuperNode
that dies is started again (its clients miss the rounds it was away for); a SuperLink that dies
ends the deployment, which ``hetfl deploy --resume RUN_DIR`` continues from the last checkpoint.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from .. import __version__
from ..errors import HetflError, warn
from ..faults import CORRUPTIONS
from ..rundir import atomic_write_text, lock_run_dir, readable_json_file, unlock_run_dir
from .federation import Federation
from .identity import NodeIdentity

def app_pyproject(name: str, description: str, serverapp: str, clientapp: str, config: str, usage: str = "") -> str:
    """The pyproject.toml of a Flower App of hetfl's (``serverapp``, ``clientapp``: Flower's ``module:object``
    references), with the run config keys ``config`` (TOML lines) and ``usage`` (comment lines) on top."""
    return f'''{usage}[project]
name = "{name}"
version = "{__version__}"
description = "{description}"
license = "Apache-2.0"
dependencies = ["hetfl[flower]=={__version__}"]

[tool.flwr.app]
publisher = "hetfl"

[tool.flwr.app.components]
serverapp = "{serverapp}"
clientapp = "{clientapp}"

[tool.flwr.app.config]
{config}
'''


APP_PYPROJECT = app_pyproject(
    "hetfl-app", "hetfl: the ServerApp runs a hetfl method's strategy, the ClientApp runs hetfl's client function",
    "hetfl.flower.server_app:app", "hetfl.flower.client_app:app",
    'config = ""   # a hetfl TOML file on the SuperLink\'s machine: a new run\n'
    'run-dir = ""  # or a run folder to continue from its last checkpoint\n'
    'secure-aggregation = false  # every round by Flower\'s SecAgg+: the server sees only sums\n'
    'secure-clipping-range = 8.0  # with it: each entry of a client\'s update must move less than this',
    usage="# hetfl's methods as a Flower App; run it with\n"
          "#   flwr run THIS_FOLDER CONNECTION --run-config 'config=\"/abs/path/my.toml\"' --stream\n")


class DeployFailed(HetflError):
    """The deployment started but did not finish (not bad input): exit code 1."""

    exit_code = 1


def write_app(folder: Path, pyproject: str = APP_PYPROJECT) -> Path:
    """``folder``, now holding the Flower App (its pyproject.toml names hetfl's ServerApp and ClientApp)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "pyproject.toml", pyproject)
    except OSError as e:
        raise HetflError(f"--write-app {folder}: cannot write the app there: {e.strerror or e}") from None
    return folder


def node_configs(num_nodes: int, root: Path, data_dir: str = "", extra: dict[int, dict] | None = None) -> list[dict]:
    """The node config of each of ``num_nodes`` SuperNodes: node K is client K (partition K of the run's data),
    keeps its own state in ``ROOT/node-K``, plus what ``extra[K]`` says (e.g. its budget)."""
    configs = []
    for k in range(num_nodes):
        config = {"partition-id": k, "num-partitions": num_nodes, "state-dir": str(Path(root) / f"node-{k}")}
        if data_dir:
            config["data-dir"] = str(Path(data_dir).resolve())
        configs.append({**config, **(extra or {}).get(k, {})})
    return configs


def deploy(run_dir: Path, num_nodes: int, data_dir: str = "", tls: bool = False, node_auth: bool = False,
           extra: dict[int, dict] | None = None, verbose: bool = False) -> dict:
    """The summary of the run in ``run_dir`` (a run folder holding its config, new or interrupted), run to its
    end on a loopback federation of ``num_nodes`` SuperNodes; HetflError when it fails."""
    configs = node_configs(num_nodes, run_dir / "flower", data_dir, extra)
    lock_run_dir(run_dir)  # refused if another process writes it; the ServerApp takes it over below
    unlock_run_dir(run_dir)
    with sigterm_interrupts(), \
            Federation(run_dir / "flower", tls=tls, node_auth=node_auth, nodes=num_nodes) as federation:
        secure = (run_dir / "flower" / "secure-aggregation.json").exists()  # secure.SETTINGS_FILE
        print(f"hetfl: {run_dir}: a SuperLink at {federation.address}{' (TLS)' if federation.tls else ''} and "
              f"{num_nodes} SuperNodes{' (authenticated)' if node_auth else ''}"
              f"{', every round by SecAgg+' if secure else ''}; logs in {federation.root / 'logs'}", flush=True)
        for k, config in enumerate(configs):
            federation.add_node(str(k), config)
        return run_on(federation, run_dir, verbose)


def run_on(federation: Federation, run_dir: Path, verbose: bool = False) -> dict:
    """The summary of the run in ``run_dir``, run to its end as hetfl's Flower App on ``federation`` (its nodes
    started); DeployFailed when it does not finish."""
    app = write_app(federation.root / "app")
    _follow(federation, federation.run_app(app, {"run-dir": str(run_dir.resolve())}), run_dir, verbose)
    if not readable_json_file(run_dir / "summary.json"):
        raise DeployFailed(f"the run did not finish; the logs are in {federation.root / 'logs'}; continue it "
                           f"with: hetfl deploy --resume {run_dir}")
    return json.loads((run_dir / "summary.json").read_text())


def _follow(federation: Federation, run, run_dir: Path, verbose: bool) -> None:
    """Returns None once ``flwr run`` ends: shows hetfl's lines of its log (every line with ``verbose``), starts
    again the SuperNodes that die, and raises DeployFailed if the SuperLink dies."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(run.stdout, lines), daemon=True).start()
    with open(federation.log("run"), "a") as log:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            log.write(line)
            if line.startswith("hetfl") or (verbose and line):
                print(line.rstrip("\n"), flush=True)
            if federation.superlink.poll() is not None:
                raise DeployFailed(f"the SuperLink died; the logs are in {federation.root / 'logs'}; continue the "
                                   f"run with: hetfl deploy --resume {run_dir}")
            for name in federation.restart_dead_nodes():
                warn(f"SuperNode {name} died; started it again (its log: {federation.log(f'node-{name}')})")
    run.wait()


def _pump(stream, lines: queue.Queue) -> None:
    """Returns None; puts every line of ``stream`` into ``lines``, then None."""
    for line in stream:
        lines.put(line)
    lines.put(None)


@contextmanager
def sigterm_interrupts():
    """Within the block a SIGTERM (``timeout``, a scheduler) raises KeyboardInterrupt, as Ctrl-C does, so the
    federations opened in it stop every process they started (in sessions of their own, they would outlive this
    process and load the machine: a killed ``bench flower`` once left 10 SuperNodes spending 70% of its cores)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def parse_node_configs(values: list[str], num_nodes: int) -> dict[int, dict]:
    """``--node-config 'K:key=value ...'`` values as node -> extra node config; HetflError naming a bad one."""
    extra: dict[int, dict] = {}
    for value in values:
        node, sep, pairs = value.partition(":")
        if not sep or not node.strip().isdigit() or int(node) >= num_nodes:
            raise HetflError(f"--node-config {value!r} must be 'K:key=value ...' with K a node 0..{num_nodes - 1}")
        for pair in pairs.split():
            key, eq, text = pair.partition("=")
            if not eq or not key:
                raise HetflError(f"--node-config {value!r}: '{pair}' is not key=value")
            # node config values are integers or strings (quoted or not)
            extra.setdefault(int(node), {})[key] = int(text) if text.isdigit() else text.strip("'\"")
    for node, config in extra.items():
        try:
            NodeIdentity.from_config({"partition-id": node, "num-partitions": num_nodes, **config})
        except HetflError as e:
            raise HetflError(f"--node-config of node {node}: {e}") from None
        if config.get("corrupt", CORRUPTIONS[0]) not in CORRUPTIONS:
            raise HetflError(f"--node-config of node {node}: corrupt {config['corrupt']!r} is unknown; one of "
                             f"{', '.join(CORRUPTIONS)}")
    return extra
