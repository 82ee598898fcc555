"""hetfl on Flower: a real SuperLink and real SuperNodes on loopback, each guarantee a test.

1. the same final weights as the simulator (FedAvg, DepthFL with FedDyn state on the nodes' disks,
   HeteroFL with different sub-models per node, only the local tensors on the wire);
2. TLS and SuperNode authentication: a node whose key is not on the SuperLink's list is refused;
3. a SuperNode killed with SIGKILL mid-round: the round ends at its deadline, the client is recorded
   as missing, the node comes back and takes part again;
4. the SuperLink and ServerApp killed with SIGKILL after a round: ``hetfl deploy --resume`` ends with
   the weights of an uninterrupted run (and a Ctrl-C on the way stops every process);
5. bad replies (here a node that sends NaNs) are rejected with the client's id, never aggregated;
6. every node trains on its warm worker, so 1 holds with workers; a worker killed with a message
   waiting for it loses nothing (a new worker trains it), one hung mid-round loses its client for
   that round only (the weights of a simulator run where it dropped out), and Flower's floor app
   sends and returns messages of the sizes it is given.

Every process runs with one thread (results are compared bit for bit with the simulator run in
this process with one thread), every wait has a deadline, and every test checks that no process it
started is left. Skipped without Flower (``pip install 'hetfl[flower]'``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from hetfl.costs import measure  # noqa: E402
from hetfl.flower.deploy import write_app  # noqa: E402
from hetfl.flower.federation import Federation  # noqa: E402
from hetfl.flower.timing import read_timings  # noqa: E402
from hetfl.methods import config_from  # noqa: E402
from hetfl.rundir import unlock_run_dir  # noqa: E402
from hetfl.sim import Simulation  # noqa: E402
from weights import assert_identical, weights  # noqa: E402
from worker_log import live_processes_in, queued_at, worker_lines, worker_pids  # noqa: E402

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TIMEOUT = 240  # seconds for any one run on Flower; a few rounds on digits take well under a minute


def small_cfg(out: Path, name: str, **changes):
    """3 clients on digits, all in every round, a quarter-width CNN: seconds per round on Flower."""
    base = dict(dataset="digits", model_width=0.25, num_clients=3, levels=3, client_fraction=1.0, rounds=2,
                batch_size=16, lr=0.05, round_timeout=120, out=str(out), name=name)
    return config_from({**base, **changes})


@pytest.fixture
def one_thread():
    """Torch on one thread in this process (as on every node), restored after the test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def simulated(cfg, dropped: dict[int, set[int]] | None = None) -> tuple[dict, list[dict]]:
    """The final weights and round records of ``cfg`` run by the simulator in this process, the clients in
    ``dropped[round]`` sending nothing in that round."""
    from hetfl.executors import Executor, Reply

    class Dropping(Executor):
        def __init__(self, inner: Executor):
            self.inner, self.name = inner, inner.name

        def execute(self, jobs, round_index):
            jobs = list(jobs)
            kept = [job for job in jobs if job.client not in (dropped or {}).get(round_index, ())]
            replies = {job.client: reply for job, reply in self.inner.execute(kept, round_index)}
            for job in jobs:
                yield job, replies.get(job.client, Reply())

    sim = Simulation(cfg.replace(name=cfg.name + "-sim"), executor=lambda s: Dropping(s.local_executor()))
    sim.run(progress=False)
    return sim.global_state, records(sim.run_dir)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wait_for(condition, what: str, deployment: Deploy) -> None:
    """Returns None once ``condition()`` holds; fails if ``deployment`` ends first or TIMEOUT passes."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert deployment.process.poll() is None, f"deploy ended before {what}: {deployment.log.read_text()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {deployment.log.read_text()}"
        time.sleep(0.05)


# ---- guarantees 1 and 2: one federation over TLS with authenticated nodes, and an intruder ----------------------
@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A SuperLink over TLS with SuperNode authentication, 3 listed SuperNodes (clients 0-2) and one whose key is
    not on the list, posing as client 2 with NaN replies."""
    root = tmp_path_factory.mktemp("federation")
    with Federation(root, tls=True, node_auth=True, env=ONE_THREAD) as fed:
        for k in range(3):
            fed.add_node(str(k), {"partition-id": k, "num-partitions": 3, "state-dir": str(root / f"node-{k}")})
        fed.intruder = fed.add_node("intruder", {"partition-id": 2, "num-partitions": 3, "corrupt": "nan",
                                                 "state-dir": str(root / "intruder")}, registered=False)
        yield fed
    assert not live_processes_in(root)


def run_on(federation: Federation, cfg) -> Path:
    """The run folder of ``cfg`` run to its end as an app on ``federation``."""
    run_dir = Simulation(cfg).create_run_dir()
    unlock_run_dir(run_dir)  # the ServerApp writes it
    process = federation.run_app(write_app(federation.root / "app"), {"run-dir": str(run_dir)})
    out, _ = process.communicate(timeout=TIMEOUT)
    assert (run_dir / "summary.json").exists(), out
    return run_dir


@pytest.mark.soak
def test_flower_runs_give_the_simulators_weights_over_tls_with_authenticated_nodes(federation, tmp_path, one_thread):
    cfgs = [small_cfg(tmp_path, "fedavg", method="alllarge", rounds=1),
            small_cfg(tmp_path, "heterofl", method="heterofl", rounds=1),  # widths 1/3, 2/3, 1: one per node
            small_cfg(tmp_path, "depthfl", method="depthfl")]  # FedDyn: each client's g_k on its node's disk
    for cfg in cfgs:
        run_dir = run_on(federation, cfg)
        want, want_records = simulated(cfg)
        assert_identical(want, weights(run_dir))
        got = records(run_dir)
        for g, w in zip(got, want_records):
            assert (g["clients"], g["bytes_down"], g["bytes_up"], g["eval"]) == \
                (w["clients"], w["bytes_down"], w["bytes_up"], w["eval"])
            assert g["clients"] == 3 and not g["missing"] and not g["rejected"]  # the intruder took no part
            # only each client's local tensors went down: their bytes plus a small header per tensor
            assert 0 < g["wire_bytes_down"] - g["bytes_down"] <= 128 * len(want) * 3
        if cfg.method == "heterofl":  # the sub-model sizes `hetfl costs` reports, one per level
            method = Simulation(cfg.replace(name="costs")).method
            sizes = [measure(method.family, method.level_spec(level)).bytes_down for level in (1, 2, 3)]
            assert got[0]["bytes_down"] == sum(sizes) < 3 * sizes[-1]
        if cfg.method == "depthfl":
            run = json.loads((run_dir / "config.json").read_text())
            for k in range(3):
                states = sorted(p.name for p in (federation.root / f"node-{k}" / "runs").glob(f"*/client-{k}/*.pt"))
                assert states == ["round-1.pt", "round-2.pt"], (k, states, run["name"])
    # the intruder was refused at the door: it never became a node of the federation
    assert federation.intruder.wait(timeout=TIMEOUT) != 0
    nodes = json.loads(federation.flwr("supernode", "ls", "hetfl", "--format", "json"))
    assert len([n for n in nodes["nodes"] if n.get("status") == "online"]) == 3, nodes


class AnsweringGrid:
    """A Grid whose every node answers every message at once; ``order`` gets ("floor", round) at each push."""

    def __init__(self, order: list):
        self.order, self.sent = order, 0

    def get_node_ids(self) -> list[int]:
        return [1, 2]

    def push_messages(self, messages: list) -> list[str]:
        self.order.append(("floor", int(messages[0].metadata.group_id)))
        self.sent += len(messages)
        return [f"m{self.sent - k}" for k in range(len(messages))]

    def pull_messages(self, ids: list[str]) -> list:
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), has_error=lambda: False,
                                has_content=lambda: True, content={"arrays": {"w": SimpleNamespace(data=b"1234")}})
                for i in ids]


@pytest.mark.parametrize("in_turns", [True, False])
def test_the_floor_and_hetfl_take_their_rounds_in_turn_and_the_floors_last_comes_after_hetfls_end(
        tmp_path, monkeypatch, in_turns):
    from flwr.supercore.task_identity import TaskIdentity

    from hetfl.flower import floor
    from hetfl.flower.baton import BATON_ENV, FLOOR, HETFL, Baton, taking_turns

    for field in ("_run_id", "_node_id", "_task_id"):  # as in a ServerApp's process: its messages name them
        monkeypatch.setattr(TaskIdentity, field, 1)
    baton, order = Baton(tmp_path / "baton"), []
    if in_turns:
        monkeypatch.setenv(BATON_ENV, str(baton.path))
        baton.give("bench")
    else:
        monkeypatch.delenv(BATON_ENV, raising=False)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"nodes": 2, "rounds": 3, "work_units": 1, "arrays": {"w": [[1], "float32"]},
                                "timeout": 20, "out": str(tmp_path / "floor.json")}))
    server = threading.Thread(target=floor.rounds, args=(AnsweringGrid(order), SimpleNamespace(run_config={
        "spec": str(spec)})))
    server.start()
    if not in_turns:  # nothing waits: the floor runs its rounds straight through
        server.join(timeout=20)
        assert order == [("floor", 1), ("floor", 2), ("floor", 3)]
        return
    baton.wait_for(HETFL, 20)  # the floor is ready and waits for its first turn
    sim = SimpleNamespace(cfg=SimpleNamespace(rounds=3, round_timeout=20))
    after_round = taking_turns(lambda sim, record: None, baton, me=HETFL, other=FLOOR)
    for t in (1, 2, 3):  # hetfl's rounds, as Simulation.run calls on_round after each
        order.append(("hetfl", t))
        after_round(sim, {"round": t})
    assert baton.holder() == HETFL  # hetfl keeps it after its last round: the floor's last round waits
    time.sleep(0.2)
    assert order[-1] == ("hetfl", 3)
    baton.give(FLOOR)  # as the bench does once hetfl's run has ended
    server.join(timeout=20)
    assert order == [("hetfl", 1), ("floor", 1), ("hetfl", 2), ("floor", 2), ("hetfl", 3), ("floor", 3)]
    assert json.loads((tmp_path / "floor.json").read_text())["replies"] == [2, 2, 2]


@pytest.mark.parametrize("ended", [True, False])
def test_a_floor_that_fails_or_never_gets_ready_fails_its_turn_and_is_stopped(tmp_path, ended):
    from hetfl.bench.flower import in_turns
    from hetfl.flower.baton import Baton
    from hetfl.flower.deploy import DeployFailed

    class Floor:  # a floor run that ended without its figures, or that never hands the baton on
        stopped = False

        def ended(self) -> bool:
            return ended

        def figures(self) -> dict:
            raise DeployFailed("Flower's floor did not finish: its log")

        def stop(self) -> None:
            self.stopped = True

    baton, floor = Baton(tmp_path / "baton"), Floor()
    baton.give("bench")
    why = "did not finish: its log" if ended else "did not start within 0.2 s"
    with pytest.raises(DeployFailed, match=why):
        in_turns(None, baton, floor, SimpleNamespace(round_timeout=0.2))  # hetfl's run never starts
    assert floor.stopped


def test_a_baton_that_does_not_come_back_is_an_error_naming_its_holder(tmp_path):
    from hetfl.errors import HetflError
    from hetfl.flower.baton import Baton

    baton = Baton(tmp_path / "baton")
    baton.give("floor")
    with pytest.raises(HetflError, match="did not come back to hetfl within 0.1 s .held by floor"):
        baton.wait_for("hetfl", 0.1)


@pytest.mark.soak
def test_the_floor_app_round_trips_messages_of_the_sizes_it_is_given(federation):
    from hetfl.bench.flower import run_floor
    from hetfl.flower.floor import units_for

    arrays = {"conv.weight": [[16, 1, 3, 3], "float32"], "bn.num_batches_tracked": [[], "int64"]}
    got = run_floor(federation, nodes=3, rounds=2, work_units=units_for(0.2), arrays=arrays, timeout=120)
    assert got["nodes"] == 3 and got["replies"] == [3, 3]  # the intruder took no part
    payload = 16 * 9 * 4 + 8
    assert all(3 * payload < b <= 3 * (payload + 2 * 128) for b in got["bytes_up"]), got  # plus a header per array
    assert all(s >= 0.1 for s in got["seconds"])  # the work's 0.2 CPU-s, give or take the machine's load
    for k in range(3):  # each message's times, for bench flower
        timings = read_timings((federation.root / f"node-{k}" / "floor.log").read_text().splitlines())
        assert [t["round"] for t in timings] == ["1", "2"]
        assert all(t["created"] - 0.05 <= t["started"] <= t["called"] <= t["replied"] for t in timings)


@pytest.mark.soak
def test_bench_flower_times_the_floor_and_hetfl_round_by_round_and_says_where_a_message_goes(tmp_path, one_thread,
                                                                                     capsys):
    from hetfl.bench.flower import exchange_spans, run_flower_bench, steady_messages

    figures = run_flower_bench(rounds=3, nodes=2, repeats=2, out=str(tmp_path))
    low, high = figures["overhead_spread_s"]
    assert len(figures["turns_s"]) == 2 and low <= figures["overhead_per_message_s"]["warm"] <= high
    assert [z["units"] > 0 for z in figures["floor_sized"]] == [True, True]  # sized again for each turn
    for kind in ("floor", "warm"):
        stages = figures["stages_s"][kind]
        assert len(stages["total"]) == 2 * 2 * 2  # 2 nodes, rounds 2 and 3, 2 turns
        assert all(v >= -0.05 for name in ("delivery", "ClientApp start", "work", "return") for v in stages[name])
        assert figures["cpu_per_message_s"][kind]["SuperLink"] > 0
    found = steady_messages(tmp_path / "federation-warm", 2, tmp_path / "exchanges.jsonl")
    spans = sorted((pushed, arrived, kind) for kind in found  # hetfl's and the floor's steady rounds take turns
                   for pushed, arrived in exchange_spans(found[kind]).items())
    assert [kind for *_, kind in spans] == ["warm", "floor"] * 4  # rounds 2 and 3 of 2 turns
    assert all(end < following for (_, end, _), (following, *_) in zip(spans, spans[1:]))
    floor, warm = figures["cpu_per_message_s"]["floor"], figures["cpu_per_message_s"]["warm"]
    assert min(floor.values()) >= 0 and min(warm.values()) >= 0  # no process's seconds lost as it exits
    assert floor["ClientApps"] > warm["ClientApps"]  # the floor's do the work: each round's own, not the one before's
    assert floor["ClientApps"] >= 0.9 * figures["floor_train_cpu_seconds"]
    # idle in the floor's rounds, the warm workers may still be charged a clock tick (0.01 s): each checks its owner
    # every second, and the sampler's readings reach up to 0.25 s past each end of a round, into hetfl's
    assert floor["hetfl workers"] <= 0.05 * figures["floor_train_cpu_seconds"]
    assert warm["hetfl workers"] >= 0.5 * figures["floor_train_cpu_seconds"]  # the training left the ClientApp
    out = capsys.readouterr().out
    assert "; the largest: " in out and "hetfl's overhead per message with warm workers" in out
    assert not live_processes_in(tmp_path)


# ---- guarantees 3, 4, 5: `hetfl deploy` with a node that dies, a node that lies, a server that dies ------------
def ctrl_c_as_usual() -> None:
    """SIGINT back to its default in the child: a suite started as a shell's background job inherits it ignored,
    and the tests that press Ctrl-C would then test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Deploy:
    """A running `hetfl deploy ARGS` (every process on one thread), its output in ``log``; stopped like Ctrl-C
    (SIGTERM: it stops every process it started) if the test leaves it running."""

    def __init__(self, log: Path, *args: str):
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "hetfl", "deploy", *args], stdout=out,
                                            stderr=subprocess.STDOUT, env={**os.environ, **ONE_THREAD},
                                            preexec_fn=ctrl_c_as_usual)

    def __enter__(self) -> Deploy:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def finish(self) -> tuple[int, str]:
        """Its exit code and output once it has ended."""
        code = self.process.wait(TIMEOUT)
        return code, self.log.read_text()


def flags(cfg) -> list[str]:
    """``cfg`` as `hetfl deploy` flags (its clients are the SuperNodes: --nodes)."""
    out = []
    for k, v in cfg.to_dict().items():
        v = ",".join(map(str, v)) if isinstance(v, list) else v
        if v != "" and k != "num_clients":
            out.append(f"--{k.replace('_', '-')}={v}")
    return out


def process_of(run_dir: Path, *words: str) -> int | None:
    """The pid of a live process of the deployment in ``run_dir`` whose command line holds every word."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if proc.name.isdigit() and all(w in cmdline for w in words) and \
                    Path(os.readlink(proc / "cwd")).is_relative_to(run_dir):
                return int(proc.name)
        except OSError:
            continue
    return None


@pytest.mark.soak
def test_a_node_killed_mid_round_is_missing_then_back_and_bad_replies_are_rejected(tmp_path, one_thread):
    # a deadline that a loaded 2-core machine meets in round 1, whose ClientApps start cold (30 s missed it with
    # two benches running beside the suite); round 2 waits all of it for the dead node
    cfg = small_cfg(tmp_path, "faults", method="depthfl", rounds=3, round_timeout=60)
    run_dir = tmp_path / "faults"
    with Deploy(tmp_path / "deploy.log", *flags(cfg), "--nodes=3", "--node-config", "1:corrupt=nan") as deployment:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists(), "round 1", deployment)
        node = process_of(run_dir, "flower-supernode", "partition-id=2")
        wait_for(lambda: _has_child_clientapp(node), "node 2 training", deployment)
        os.killpg(node, signal.SIGKILL)  # the device dies: its SuperNode and its ClientApp
        code, out = deployment.finish()
    assert code == 0, out
    assert "SuperNode 2 died; started it again" in out and out.count(" died; started it again") == 1
    got = records(run_dir)
    assert [r["missing"] for r in got] == [[], [2], []]  # the dead node's round ended at its deadline
    assert all(list(r["rejected"]) == ["1"] and "non-finite" in r["rejected"]["1"] for r in got)
    assert [r["clients"] for r in got] == [2, 1, 2]  # client 2 came back for round 3
    assert "dropped the update of client 1" in out
    assert not live_processes_in(run_dir)


@pytest.mark.soak
def test_a_worker_killed_with_a_message_waiting_loses_nothing_and_one_hung_loses_its_client_for_a_round(
        tmp_path, one_thread):
    cfg = small_cfg(tmp_path, "worker", method="depthfl", rounds=4, round_timeout=60)  # FedDyn state on the nodes
    run_dir = tmp_path / "worker"
    folder = run_dir / "flower" / "node-2" / "worker"
    metrics = run_dir / "metrics.jsonl"
    rounds_done = lambda n: metrics.exists() and metrics.read_text().count("\n") >= n  # noqa: E731
    with Deploy(tmp_path / "deploy.log", *flags(cfg), "--nodes=3") as deployment:
        wait_for(lambda: rounds_done(1), "round 1", deployment)
        first = worker_pids(folder)[0]
        os.kill(first, signal.SIGSTOP)  # idle between rounds; round 2's message waits at its listener
        wait_for(lambda: queued_at(first) == 1, "round 2 queued at node 2's worker", deployment)
        os.kill(first, signal.SIGKILL)  # dies before it took the message: a new worker trains it
        wait_for(lambda: rounds_done(2), "round 2", deployment)
        second = worker_pids(folder)[1]
        os.kill(second, signal.SIGSTOP)  # hung: round 3's shim stops it at the message's deadline
        code, out = deployment.finish()
    assert code == 0, out
    got = records(run_dir)
    assert [r["missing"] for r in got] == [[], [], [2], []] and not any(r["rejected"] for r in got)
    assert [r["clients"] for r in got] == [3, 3, 2, 3]  # a third worker took round 4's message
    assert worker_lines(folder, f"(round 2): worker {first} was gone before it took the message")
    assert len(worker_pids(folder)) == 3
    want, _ = simulated(cfg, dropped={3: {2}})
    assert_identical(want, weights(run_dir))
    assert not live_processes_in(run_dir)


def _has_child_clientapp(supernode: int) -> bool:
    """Whether a ClientApp runs under the SuperNode ``supernode`` (a child of its SuperExec)."""
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(supernode)], capture_output=True, text=True).stdout
    for child in children.split():
        grandchildren = subprocess.run(["ps", "-o", "cmd=", "--ppid", child], capture_output=True, text=True).stdout
        if "flwr-clientapp" in grandchildren:
            return True
    return False


def test_a_ctrl_c_while_a_process_starts_lands_once_it_is_recorded_for_stopping():
    """A KeyboardInterrupt inside ``Popen`` would orphan the child it had just forked (seen under load)."""
    from hetfl.flower.federation import _signals_deferred

    recorded = []
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, even in a background job
    try:
        with pytest.raises(KeyboardInterrupt), _signals_deferred():
            signal.raise_signal(signal.SIGINT)
            recorded.append("started")
        assert recorded == ["started"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


@pytest.mark.soak
def test_the_server_killed_after_a_round_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, one_thread):
    cfg = small_cfg(tmp_path, "killed", method="depthfl", rounds=2)
    run_dir = tmp_path / "killed"
    with Deploy(tmp_path / "deploy.log", *flags(cfg), "--nodes=3") as deployment:
        wait_for(lambda: (run_dir / "checkpoint" / "state.pt").exists(), "round 1's checkpoint", deployment)
        for words in (("flwr-serverapp",), ("flower-superlink",)):  # the server machine dies
            os.kill(process_of(run_dir, *words), signal.SIGKILL)
        code, out = deployment.finish()
    assert code == 1 and "hetfl deploy --resume" in out, out
    assert not live_processes_in(run_dir)
    assert len(records(run_dir)) == 1
    with Deploy(tmp_path / "interrupted.log", "--resume", str(run_dir)) as interrupted:  # and Ctrl-C while it starts
        wait_for(lambda: process_of(run_dir, "flower-supernode"), "a SuperNode", interrupted)
        interrupted.process.send_signal(signal.SIGINT)
        code, out = interrupted.finish()
    assert code == 130 and "interrupted" in out, out
    assert not live_processes_in(run_dir)
    with Deploy(tmp_path / "resume.log", "--resume", str(run_dir)) as resumed:
        code, out = resumed.finish()
    assert code == 0, out
    assert_identical(simulated(cfg)[0], weights(run_dir))
    assert [r["round"] for r in records(run_dir)] == [1, 2]
    assert not live_processes_in(run_dir)
