"""The parts of the Flower engine, fast and in one process: node configs, the nodes' own state and data,
the wire format, and the ServerApp's rounds over an in-process Grid whose nodes are ClientApp calls. The same
engine with real SuperLink and SuperNode processes is tests/test_flower.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetfl.devices import Budget
from hetfl.errors import HetflError
from hetfl.flower.identity import NodeIdentity
from hetfl.flower.node import OwnStates, client_data
from hetfl.sim import Simulation
from hetfl.flower.timing import read_timings
from worker_log import worker_lines, worker_pids


# ---- node configs, own state, data ---------------------------------------------------------------------------
def test_node_config_is_checked():
    node = NodeIdentity.from_config({"partition-id": 0, "num-partitions": 4, "level": 2, "state-dir": "/tmp/x"})
    assert (node.partition_id, node.num_partitions, node.level) == (0, 4, 2)
    assert NodeIdentity.from_config(node.to_config()) == node
    assert NodeIdentity.from_config({"data-path": "/data/mine.npz"}).partition_id is None
    for bad, message in [({"partition-id": 0}, "both partition-id and num-partitions"),
                         ({"level": 1}, "partition-id and num-partitions .* or data-path"),
                         ({"partition-id": 4, "num-partitions": 4}, "below num-partitions"),
                         ({"partition-id": -1, "num-partitions": 4}, "integer >= 0"),
                         ({"partition-id": 0, "num-partitions": 4, "level": "2"}, "level must be an integer"),
                         ({"partition-id": 0, "num-partitions": 4, "partition_id": 0}, "'partition_id' is unknown"),
                         ({"partition-id": 0, "num-partitions": 4, "worker": "warm"}, "worker must be one of on, off")]:
        with pytest.raises(HetflError, match=message):
            NodeIdentity.from_config(bad)


def test_own_states_are_kept_per_round_and_forgotten_when_no_resume_needs_them(tmp_path):
    states = OwnStates(tmp_path, "run", client=3)
    assert states.load(0) is None
    for t in (1, 2):
        states.save(t, {"g": torch.full((2,), float(t))}, keep_round=0)
    states.save(4, {"g": torch.full((2,), 4.0)}, keep_round=2)  # the last checkpoint needs round 2's
    assert sorted(p.name for p in states.folder.iterdir()) == ["round-2.pt", "round-4.pt"]
    assert torch.equal(states.load(2)["g"], torch.full((2,), 2.0))
    with pytest.raises(HetflError, match="no own state of round 1"):
        states.load(1)


@pytest.mark.parametrize("method", [{}, {"method": "feddf", "distill_size": 300}])  # FedDF: a holdout no client holds
def test_a_node_trains_on_the_simulators_partition_cut_once(tiny_cfg, tmp_path, method):
    sim = Simulation(tiny_cfg(partition="dirichlet", client_test_fraction=0.2, **method))
    cfg = sim.cfg
    data = {"dataset": cfg.dataset, "num_clients": cfg.num_clients, "partition": cfg.partition, "alpha": cfg.alpha,
            "classes_per_client": cfg.classes_per_client, "min_client_size": cfg.min_client_size,
            "client_test_fraction": cfg.client_test_fraction, "seed": cfg.seed,
            **({"holdout": sim.holdout} if sim.holdout else {})}
    assert sim.holdout == method.get("distill_size", 0)
    node = NodeIdentity.from_config({"partition-id": 7, "num-partitions": 20, "state-dir": str(tmp_path)})
    for _ in range(2):  # the second time from the node's cache
        got = client_data(node, 7, data)
        assert torch.equal(got.x[got.indices], sim.x_train[sim.parts[7]])
        assert torch.equal(got.y[got.indices], sim.y_train[sim.parts[7]])
    assert len(list((tmp_path / "data").glob("*.pt"))) == 1


# ---- the wire ----------------------------------------------------------------------------------------------
def test_tasks_and_updates_cross_the_wire_exactly_and_bad_replies_are_named(tiny_cfg):
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord, MetricRecord, RecordDict

    from hetfl.client import Update
    from hetfl.flower.wire import Work, read_reply, read_work, reply_content, wire_bytes, work_content
    from hetfl.slicing import state_bytes

    sim = Simulation(tiny_cfg(method="depthfl"))
    task, local = sim.method.configure(sim.state, 2, sim.budget(2, 1), 1)
    work = read_work(work_content(Work(task, local, {"dataset": "digits"}, "key", 3, 1)))
    assert (work.task, work.data, work.run, work.state_round, work.keep_round) == (task, {"dataset": "digits"}, "key",
                                                                                   3, 1)
    assert work.task.state_shapes == task.state_shapes
    assert all(torch.equal(work.local[k], v) and work.local[k].dtype == v.dtype for k, v in local.items())
    update = Update(2, task.spec, local, 17, {"train_loss": 0.5})
    content = reply_content(update)
    assert 0 < wire_bytes(content) - state_bytes(local) <= 128 * len(local)  # a small header per tensor
    back = read_reply(content)
    assert (back.client, back.spec, back.num_samples, back.metrics) == (2, task.spec, 17, {"train_loss": 0.5})
    assert all(torch.equal(back.state[k], v) for k, v in local.items())
    with pytest.raises(ValueError, match="no 'arrays' record"):
        read_reply(RecordDict({"metrics": MetricRecord({"num-examples": 1}), "config": ConfigRecord({"client": 2})}))
    broken = reply_content(update)
    broken["config"]["spec"] = "{not json"
    with pytest.raises(ValueError, match="cannot be read"):
        read_reply(broken)


# ---- the ServerApp's rounds, with nodes that are ClientApp calls in this process -------------------------------
class InProcessGrid:
    """A Flower Grid whose nodes are calls of hetfl's ClientApp in this process (node id -> node config); a node in
    ``silent`` never replies."""

    def __init__(self, node_configs: dict[int, dict]):
        self.configs = dict(node_configs)
        self.silent: set[int] = set()
        self.replies: dict[str, object] = {}
        self.count = 0

    def get_node_ids(self):
        return list(self.configs)

    def push_messages(self, messages):
        from flwr.app import Context, Error, Message, RecordDict

        from hetfl.flower.client_app import app

        ids = []
        for message in messages:
            self.count += 1
            message.metadata.__dict__["_message_id"] = f"m{self.count}"  # what Flower's own grids do
            node = message.metadata.dst_node_id
            if node not in self.silent:
                context = Context(run_id=1, node_id=node, node_config=self.configs[node], state=RecordDict(),
                                  run_config={})
                try:
                    self.replies[f"m{self.count}"] = app(message, context)
                except Exception as e:  # what Flower replies for a ClientApp that raised
                    self.replies[f"m{self.count}"] = Message(Error(2, f"{type(e).__name__}: {e}"), reply_to=message)
            ids.append(f"m{self.count}")
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


def node_configs(n: int, root, extra: dict) -> dict[int, dict]:
    """Node id 100 + k is client k of ``n``, keeping its state under ``root``, training cold in this process (no
    worker) unless ``extra[k]`` (more node config) says otherwise."""
    return {100 + k: {"partition-id": k, "num-partitions": n, "state-dir": str(root / f"node-{k}"), "worker": "off",
                      **extra.get(k, {})} for k in range(n)}


@pytest.fixture
def deployment(tiny_cfg, tmp_path, monkeypatch):
    """A Flower experiment (``deployment.deployment``) of ``tiny_cfg(**changes)`` over an in-process grid of one node
    per client."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    from hetfl.flower.deployment import deployment as flower_deployment

    for key in ("_task_id", "_run_id", "_node_id"):  # what Flower sets in a ServerApp process, and Message reads
        monkeypatch.setattr(TaskIdentity, key, 1)

    def make(extra=None, **changes):
        cfg = tiny_cfg(**{"round_timeout": 5, **changes})
        return flower_deployment(cfg, InProcessGrid(node_configs(cfg.num_clients, tmp_path, extra or {})))

    return make


def test_flower_rounds_equal_the_simulators_and_resume_exactly(deployment, tiny_cfg):
    cfg_changes = dict(method="depthfl", client_fraction=0.5, rounds=4, checkpoint_every=2)  # FedDyn state on nodes
    want = Simulation(tiny_cfg(name="sim", **cfg_changes))
    want.run(progress=False)
    whole = deployment(name="whole", **cfg_changes)
    whole.run()
    for k, v in want.global_state.items():
        assert torch.equal(v, whole.global_state[k]), k
    assert [r["eval"] for r in whole.history] == [r["eval"] for r in want.history]
    assert all(r["wire_bytes_down"] > r["bytes_down"] > 0 for r in whole.history)

    stopped = deployment(name="stopped", **cfg_changes)
    stopped.run(stop_after=3)  # checkpoint after round 2; round 3's own states stay on the nodes
    from hetfl.flower.deployment import resume_deployment
    from hetfl.rundir import unlock_run_dir

    unlock_run_dir(stopped.run_dir)
    resumed = resume_deployment(stopped.run_dir, stopped.executor.grid)
    assert resumed.start_round == 2 and resumed.executor.state_rounds
    resumed.run()
    for k, v in want.global_state.items():
        assert torch.equal(v, resumed.global_state[k]), k


def test_nodes_state_their_budgets_and_silent_or_lying_nodes_are_missing_or_rejected(deployment, capsys):
    run = deployment(extra={0: {"level": 1}, 1: {"level": 4}, 2: {"corrupt": "spec"}, 3: {"memory-bytes": 1}},
                     method="depthfl", client_fraction=1.0, rounds=2)
    run.executor.grid.silent.add(104)  # client 4's node never answers
    run.run()
    assert run.executor.budgets[0] == Budget(level=1) and run.executor.budgets[1] == Budget(level=4)
    assert run.method.plan(0, run.budget(0, 1), 1).depth == run.method.level_spec(1).depth  # a weak node: small
    assert 3 not in run.executor.nodes and 4 not in run.executor.nodes  # a budget below every sub-model; no answer to "who are you"
    err = capsys.readouterr().err
    assert "smaller than the smallest" in err and "did not say who it is" in err
    for r in run.history:
        assert r["missing"] == [3, 4]
        assert list(r["rejected"]) == ["2"] and "was not assigned" in r["rejected"]["2"]
        assert r["clients"] == 17


def test_a_node_with_its_own_data_files_takes_the_first_free_client(deployment, tmp_path):
    import numpy as np

    from hetfl.data import load_dataset

    digits = load_dataset("digits")
    own = tmp_path / "own.npz"
    np.savez(own, x_train=digits.x_train[:40].numpy(), y_train=digits.y_train[:40].numpy(),
             x_test=digits.x_test[:10].numpy(), y_test=digits.y_test[:10].numpy())
    run = deployment(method="alllarge", client_fraction=1.0, rounds=1)
    del run.executor.grid.configs[100]  # client 0's node is replaced by one with its own files and no partition-id
    run.executor.grid.configs[300] = {"data-path": str(own), "state-dir": str(tmp_path / "own-node"), "worker": "off"}
    run.run()
    assert run.executor.nodes[0] == 300
    assert run.history[0]["clients"] == 20 and not run.history[0]["missing"]


def test_a_restarted_node_serves_its_client_again(deployment):
    run = deployment(method="alllarge", client_fraction=1.0, rounds=1)
    run.run()
    assert run.executor.nodes[5] == 105
    run.executor.grid.configs[205] = run.executor.grid.configs.pop(105)  # node 105 died; its client came back as node 205
    run.executor.discover()
    assert run.executor.nodes[5] == 205


# ---- the warm worker: a long-lived process per node that trains its messages -------------------------------------
@pytest.fixture
def owner():
    """A process standing in for a SuperNode's SuperExec: the workers started for it end when it does."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts: it runs nothing)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(condition, seconds: float = 30) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_warm_workers_give_the_simulators_weights_and_end_with_their_owner(deployment, tiny_cfg, tmp_path, owner,
                                                                         monkeypatch):
    monkeypatch.setattr(os, "getppid", lambda: owner.pid)  # the shims' SuperExec
    changes = dict(method="depthfl", num_clients=3, levels=3, client_fraction=1.0, rounds=2, round_timeout=120)
    want = Simulation(tiny_cfg(name="sim", **changes))  # FedDyn: each client's g_k read from its node's disk
    want.run(progress=False)
    warm = deployment(extra={k: {"worker": "on"} for k in range(3)}, name="warm", **changes)
    warm.run()
    for k, v in want.global_state.items():
        assert torch.equal(v, warm.global_state[k]), k
    assert all(r["clients"] == 3 and not r["missing"] and not r["rejected"] for r in warm.history)
    folders = [tmp_path / f"node-{k}" / "worker" for k in range(3)]
    for folder in folders:  # one worker per node served both rounds
        assert len(worker_pids(folder)) == 1 and len(worker_lines(folder, "trained in")) == 2
        for line in worker_lines(folder, "trained in"):  # where each message's time went
            phases = json.loads(line.split("; phases ", 1)[1])
            assert {"receive+parse", "state-read", "train", "train-cpu", "state-write", "serialise"} <= set(phases)
            assert all(v >= 0 for v in phases.values()) and phases["train"] <= float(line.split()[5])
        timings = read_timings(worker_lines(folder, "replied; timing"))  # the shim's, for bench flower
        assert [t["round"] for t in timings] == ["1", "2"]
        for t in timings:
            worker = t["worker"]
            assert t["called"] <= worker["accepted"] <= worker["done"] <= t["replied"] and t["handed"] <= t["replied"]
            assert worker["phases"]["train"] <= worker["done"] - worker["accepted"]
            assert t["cpu-replied"] >= t["cpu-called"]
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    owner.kill()
    owner.wait()  # reaped: a zombie's pid would still answer
    wait_until(lambda: all(gone(worker_pids(f)[0]) and not list(f.glob("*.sock")) for f in folders))


def test_a_worker_killed_before_it_takes_a_message_is_replaced_one_killed_or_hung_after_loses_it(tmp_path, owner,
                                                                                               monkeypatch):
    import signal
    import threading

    from flwr.app import ConfigRecord, RecordDict

    from hetfl.flower import worker
    from hetfl.flower.worker import WorkerFailed, WorkerLost, ask, socket_path

    root, node = tmp_path / "node", {"partition-id": 0, "num-partitions": 1}
    folder = root / "worker"
    unreadable = RecordDict({"config": ConfigRecord({"task": "{"})})  # the worker answers with its error

    def asked(timeout=120.0):
        try:
            ask(node, root, unreadable, timeout, label="test", owner=owner.pid)
        except (WorkerFailed, WorkerLost) as e:
            return e

    def in_a_thread():
        result = []
        shim = threading.Thread(target=lambda: result.append(asked()))
        shim.start()
        return shim, result

    def hold(name):  # the shim's ``worker.NAME`` sets ``reached``, then waits for ``go`` (once set: as before)
        reached, go, real = threading.Event(), threading.Event(), getattr(worker, name)

        def held(*args):
            value = real(*args)
            reached.set()
            go.wait(60)
            return value
        monkeypatch.setattr(worker, name, held)
        return reached, go

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as a Federation sets it for 2 or more nodes a core
    assert isinstance(asked(), WorkerFailed)  # a worker started, and replied
    assert "training with 1 torch thread" in worker_lines(folder, ": listening")[0]  # not torch's default: every core
    first = worker_pids(folder)[0]

    # killed with the message's connection queued at its listener, not taken: a new worker trains the message
    os.kill(first, signal.SIGSTOP)
    connected, go = hold("connect")
    shim, result = in_a_thread()
    assert connected.wait(60)
    os.kill(first, signal.SIGKILL)
    go.set()
    shim.join(120)
    assert isinstance(result[0], WorkerFailed)
    assert worker_lines(folder, f"worker {first} was gone before it took the message")
    second = worker_pids(folder)[1]
    assert second != first and gone(first) and not gone(second)

    # killed after it took the message: lost, as a reply that never comes
    taken, go = hold("_taken")
    shim, result = in_a_thread()
    assert taken.wait(60)
    os.kill(second, signal.SIGKILL)
    wait_until(lambda: gone(second))
    go.set()
    shim.join(60)
    assert isinstance(result[0], WorkerLost) and "died while it trained" in str(result[0])
    assert socket_path(folder, owner.pid).exists()  # stale: a killed worker cannot remove it

    assert isinstance(asked(), WorkerFailed)  # the stale socket is replaced by a new worker
    third = worker_pids(folder)[2]
    assert third not in (first, second) and not gone(third)
    os.kill(third, signal.SIGSTOP)  # hung: the shim gives up at the message's deadline and stops it
    lost = asked(timeout=1.0)
    assert isinstance(lost, WorkerLost) and "did not reply" in str(lost)
    wait_until(lambda: gone(third))


def test_a_federation_polls_less_and_trains_on_fewer_threads_in_turns_the_more_nodes_share_its_cores(tmp_path,
                                                                                                   monkeypatch):
    import hetfl.flower.federation as federation
    from hetfl.flower.federation import POLL_CPU_SECONDS, POLL_SHARE, Federation, node_threads, poll_interval
    from hetfl.flower.slots import SLOTS_DIR_ENV, SLOTS_ENV

    assert poll_interval(1, 2) == 0.05 and poll_interval(10, 2) == 0.5 and poll_interval(10_000, 2) == 1.0
    intervals = [poll_interval(n, 2) for n in range(1, 41)]
    assert intervals == sorted(intervals) and poll_interval(10, 16) < poll_interval(10, 2)
    for n in range(3, 20):  # unclamped: all the nodes' polls together use POLL_SHARE of the cores
        assert n * POLL_CPU_SECONDS / poll_interval(n, 2) / 2 == pytest.approx(POLL_SHARE, rel=0.01)
    assert [node_threads(n, 2) for n in (1, 2, 3, 10)] == [2, 1, 1, 1] and node_threads(2, 16) == 8

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(federation, "cores", lambda: 8)
    env = Federation(tmp_path / "a", nodes=4).env  # no process starts before ``with``
    assert env["OMP_NUM_THREADS"] == "2" and env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == str(poll_interval(4, 8))
    assert SLOTS_ENV not in env  # 4 nodes x 2 threads: all train at once
    env = Federation(tmp_path / "b", nodes=10).env
    assert env["OMP_NUM_THREADS"] == "1" and env[SLOTS_ENV] == "8"
    assert env[SLOTS_DIR_ENV] == str(tmp_path / "b" / "slots")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins, and leaves room for 2 trainings
    env = Federation(tmp_path / "c", nodes=4).env
    assert env["OMP_NUM_THREADS"] == "3" and env[SLOTS_ENV] == "2"


def test_a_dead_node_is_started_again_on_a_port_of_its_own(tmp_path):
    # its old port may be what it died of: taken, before it bound it, by another process's connection
    from hetfl.flower import federation
    from hetfl.flower.federation import Federation

    fed = Federation(tmp_path, nodes=2)  # no SuperLink: the node's command is a stand-in that exits at once
    command = [sys.executable, "-c", "pass", "--port", "20001", "--node-config", "x=1"]
    dead = subprocess.Popen(command[:3], start_new_session=True)
    dead.wait()
    fed.nodes["1"] = (command, dead, time.monotonic())
    assert fed.restart_dead_nodes() == []  # not sooner than RESTART_SECONDS after its last start
    fed.nodes["1"] = (command, dead, time.monotonic() - federation.RESTART_SECONDS)
    assert fed.restart_dead_nodes() == ["1"]
    again, process, _ = fed.nodes["1"]
    assert again[:4] == command[:4] and again[5:] == command[5:] and again[4] != "20001"
    fed.stop()  # stops what it started again
    assert process.poll() is not None and fed.log("node-1").exists()


def test_the_floors_replies_are_arrays_of_its_own_of_the_sizes_it_got_and_it_logs_their_times(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hetfl.flower.floor import work_and_reply

    for key in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, key, 1)
    sent = ArrayRecord({"w": Array(np.zeros((4, 3), dtype="float32")), "v": Array(np.zeros((4, 3), dtype="float32")),
                        "n": Array(np.zeros((), dtype="int64"))})
    context = Context(run_id=1, node_id=7, node_config={"state-dir": str(tmp_path / "node")}, state=RecordDict(),
                      run_config={})
    replies = []
    for k in range(2):
        message = Message(RecordDict({"arrays": sent, "config": ConfigRecord({"work-units": 3})}), 7,
                          "train", group_id="2")
        message.metadata.__dict__["_message_id"] = f"{k + 1:064x}"
        replies.append(work_and_reply(message, context).content["arrays"])
    sizes = {name: (a.shape, a.dtype) for name, a in sent.items()}
    assert all({name: (a.shape, a.dtype) for name, a in got.items()} == sizes for got in replies)
    first, second = (got["w"].numpy() for got in replies)  # an echo, or equal replies, would not travel up
    assert not np.array_equal(first, second) and not np.array_equal(first, sent["w"].numpy())
    for got in replies:  # two alike in one message would travel as one, where a model's arrays all travel
        assert not np.array_equal(got["w"].numpy(), got["v"].numpy())
        assert len({a.object_id for a in got.values()}) == 3
    timings = read_timings((tmp_path / "node" / "floor.log").read_text().splitlines())
    assert [t["round"] for t in timings] == ["2", "2"] and [t["message"] for t in timings] == [f"{1:064x}", f"{2:064x}"]
    assert all(t["called"] <= t["replied"] and t["cpu-replied"] - t["cpu-called"] > 0 for t in timings)


def test_the_floors_work_is_a_count_of_steps_that_take_the_cpu_seconds_it_was_sized_for():
    pytest.importorskip("flwr")
    from hetfl.flower.floor import units_for, work

    units = units_for(0.3, sample_seconds=0.2)
    started = time.process_time()
    work(units)
    assert 0.1 <= time.process_time() - started <= 0.9  # a factor of 3 either way: the machine may be busy
    assert units_for(0.0, sample_seconds=0.01) == 1  # never nothing: a message always works


def test_bench_flower_times_the_rounds_after_the_first_less_their_evaluation():
    from hetfl.bench.flower import steady_round

    history = [{"seconds": 9.0, "eval_seconds": 0.0}, {"seconds": 3.0, "eval_seconds": 0.0},
               {"seconds": 5.5, "eval_seconds": 2.0}]
    assert steady_round(history) == 3.25


def test_the_floors_work_is_sized_to_trainings_in_this_process_now_and_leaves_the_simulator_as_it_was(tiny_cfg):
    from hetfl.bench.flower import floor_work_now
    from hetfl.flower.floor import units_for

    sim = Simulation(tiny_cfg(rounds=1))
    sim.run(progress=False)
    before = {k: v.clone() for k, v in sim.global_state.items()}
    sized = floor_work_now(sim, trainings=3)
    low, high = sized["spread"]
    assert 0 < low <= sized["cpu_seconds"] <= high
    assert abs(sized["units"] - units_for(sized["cpu_seconds"])) <= max(2, 0.5 * sized["units"])  # the same scale
    assert all(torch.equal(before[k], v) for k, v in sim.global_state.items())
    assert len(sim.history) == 1


def test_bench_flower_splits_a_message_into_its_stages_and_counts_cpu_between_readings(tmp_path):
    from hetfl.bench.flower import CpuSampler, message_stages, process_kind

    message = {"created": 100.0, "started": 100.5, "called": 102.0, "replied": 106.0, "arrived": 107.5,
               "cpu-replied": 1.9, "worker": {"accepted": 102.25, "done": 105.75, "phases": {"train": 3.0}}}
    assert message_stages(message) == {"delivery": 0.5, "ClientApp start": 1.5, "work": 4.0, "return": 1.5,
                                       "total": 7.5, "ClientApp CPU": 1.9, "to the worker": 0.25,
                                       "in the worker": 3.5, "back from it": 0.25, "train": 3.0}
    sampler = CpuSampler(tmp_path)
    sampler.samples = [(0.0, {"SuperLink": 0.0}), (1.0, {"SuperLink": 2.0}), (2.0, {"SuperLink": 5.0}),
                       (3.0, {"SuperLink": 9.0})]
    assert sampler.between(1.0, 2.0) == {"SuperLink": 3.0}
    assert sampler.between(1.5, 2.5) == {"SuperLink": 7.0}  # from the reading before to the one after
    rounds = [{"pushed": 1.0, "arrived": 1.5}, {"pushed": 1.0, "arrived": 2.0}, {"pushed": 2.0, "arrived": 3.0}]
    assert sampler.per_message(rounds, nodes=2) == {"SuperLink": 1.75}  # rounds of 3 and 4 CPU-s: 3.5 / 2 messages
    assert [process_kind(c) for c in ("/v/bin/python3 /v/bin/flower-superexec --insecure --parent-pid 7",
                                      "/v/bin/python3 -m hetfl.flower.worker /s/worker 12", "/v/bin/flwr-clientapp",
                                      "/v/bin/python3 /v/bin/flower-supernode --superlink", "bash")] == \
        ["SuperExecs", "hetfl workers", "ClientApps", "SuperNodes", None]


def test_an_exited_clientapp_not_yet_reaped_keeps_its_cpu_seconds_in_the_readings(tmp_path):
    from hetfl.bench.flower import cpu_by_kind

    burn = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('ready', flush=True)\nsys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", burn, "flwr-clientapp"], cwd=tmp_path, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == "ready\n"
        seen: dict = {}
        alive = cpu_by_kind(tmp_path, seen)["ClientApps"]
        child.stdin.close()  # it exits; this process, its parent, does not reap it yet
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert alive >= 0.25
        assert cpu_by_kind(tmp_path, seen)["ClientApps"] >= alive  # read alive before: still counted
        assert cpu_by_kind(tmp_path, {})["ClientApps"] == 0  # never read alive: its kind is unknown
    finally:
        child.kill()
        child.wait()


def test_trainings_take_turns_in_the_machines_slots_and_a_killed_holder_frees_its_slot(tmp_path, monkeypatch):
    import threading
    import time

    from hetfl.flower.slots import SLOTS_DIR_ENV, SLOTS_ENV, training_slot

    with training_slot():  # none set: nothing waits
        pass
    monkeypatch.setenv(SLOTS_ENV, "2")
    monkeypatch.setenv(SLOTS_DIR_ENV, str(tmp_path / "slots"))
    inside, most, lock = [0], [0], threading.Lock()

    def train():
        with training_slot():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    trainings = [threading.Thread(target=train) for _ in range(6)]
    for t in trainings:
        t.start()
    for t in trainings:
        t.join()
    assert most[0] == 2  # two at once, never three

    monkeypatch.setenv(SLOTS_ENV, "1")
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom hetfl.flower.slots import training_slot\n"
                               "with training_slot():\n    print('in', flush=True)\n    time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "in"
        waiter = threading.Thread(target=train)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # the one slot is the holder's
    finally:
        holder.kill()  # kill -9: the kernel drops its lock
        holder.wait()
    waiter.join(10)
    assert not waiter.is_alive()


def test_a_worker_folder_others_may_enter_or_a_socket_not_ours_is_refused(tmp_path):
    from hetfl.flower.worker import connect, private_folder, socket_path

    folder = private_folder(tmp_path / "node")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    os.chmod(folder, 0o750)
    with pytest.raises(HetflError, match="only they may enter"):
        private_folder(tmp_path / "node")
    os.chmod(folder, 0o700)
    socket_path(folder, 1).write_text("planted")
    with pytest.raises(HetflError, match="not a socket of this user's"):
        connect(folder, 1)
    assert connect(folder, 2) is None  # no worker yet


def test_a_worker_serves_no_other_user(tmp_path, monkeypatch):
    import socket

    from hetfl.flower import worker

    folder = worker.private_folder(tmp_path / "node")
    ours, theirs = socket.socketpair(socket.AF_UNIX)
    monkeypatch.setattr(worker, "peer_uid", lambda sock: os.getuid() + 1)
    worker.send_frame(theirs, b'{"node": {}}')
    worker.handle(ours, folder, {})
    ours.close()
    try:
        reply = theirs.recv(8)
    except ConnectionResetError:  # closed with the request unread
        reply = b""
    assert reply == b""  # closed without a reply
    assert worker_lines(folder, f"refused a connection from uid {os.getuid() + 1}")


# ---- the command, without Flower processes ----------------------------------------------------------------------
def hetfl(*args: str, block_flower: bool = False) -> subprocess.CompletedProcess:
    """`hetfl ARGS` in a fresh process; ``block_flower``: as if Flower were not installed."""
    code = ("import sys; sys.modules['flwr'] = None; " if block_flower else "import sys; ") + \
        "from hetfl.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("args,message", [
    (["--nodes", "3", "--num-clients", "4"], "equal num_clients"),
    (["--nodes", "3", "--levels", "3", "--node-config", "3:level=1"], "K a node 0..2"),
    (["--nodes", "3", "--levels", "3", "--node-config", "1:corrupt=gibberish"], "corrupt 'gibberish' is unknown"),
    (["--nodes", "3", "--levels", "3", "--node-config", "1:budget=3"], "'budget' is unknown"),
    (["--resume", "/nonexistent"], "not a hetfl run folder"),
])
def test_deploy_refuses_bad_input_before_anything_starts(tmp_path, args, message):
    pytest.importorskip("flwr")
    experiment = [] if "--resume" in args else ["--dataset", "digits", "--out", str(tmp_path / "runs")]
    done = hetfl("deploy", *experiment, *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()


def test_without_flower_deploy_says_what_to_install_and_the_rest_runs(tmp_path):
    done = hetfl("deploy", "--nodes", "3", "--out", str(tmp_path / "runs"), block_flower=True)
    assert done.returncode == 2 and "pip install 'hetfl[flower]'" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
    done = hetfl("run", "--dataset", "digits", "--model-width", "0.25", "--num-clients", "4", "--client-fraction", "1",
                 "--levels", "2", "--rounds", "1", "--quiet", "--out", str(tmp_path / "runs"), "--name", "plain",
                 block_flower=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "runs" / "plain" / "summary.json").read_text())["rounds"] == 1
