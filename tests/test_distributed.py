"""One run over several processes (``hetfl.distributed``, ``executors.distributed``): one process's weights and
scores whatever the number of processes, rank 0 the only writer, resume with another number, lost ranks named."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetfl.distributed import Team, launch, to_cpu
from hetfl.evaluate import batch_tally, exit_scores, tally_scores
from hetfl.executors.distributed import DistributedExecutor
from hetfl.ports import free_port
from tinybert import tiny_bert_dir  # noqa: F401  (fixture)

HERE = Path(__file__).parent
DIGITS = ["--dataset", "digits", "--model-width", "0.25", "--num-clients", "12", "--client-fraction", "0.5",
          "--rounds", "3", "--batch-size", "16", "--lr", "0.05", "--checkpoint-every", "1", "--quiet"]


def rank_env(rank: int, size: int, port: int, **extra) -> dict:
    """The environment a launcher gives rank ``rank`` of ``size`` (one thread: ``hetfl run --processes 2`` on 2
    cores)."""
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **extra}


def start_ranks(size: int, command: list[str], envs: list[dict] | None = None) -> list[subprocess.Popen]:
    """``command`` started as ``size`` ranks (``envs[r]``: more environment of rank r)."""
    port = free_port()
    return [subprocess.Popen(command, env=rank_env(r, size, port, **(envs[r] if envs else {})), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(size)]


def hetfl(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetfl", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final_model.pt", weights_only=True)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])]


def records(run_dir: Path) -> list[dict]:
    """What a run measured each round, less its timing."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("seconds", "eval_seconds")} for r in rows]


def only_run(out: Path) -> Path:
    (run,) = list(out.iterdir())
    return run


# ---- the parts, by hand -------------------------------------------------------------------------
def test_shares_are_contiguous_in_rank_order_and_differ_by_at_most_one():
    for n in range(0, 12):
        for size in range(1, 5):
            shares = [Team(rank=r, size=size).share(n) for r in range(size)]
            assert [i for s in shares for i in s] == list(range(n))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_plain_cuda_gives_each_rank_a_gpu_in_turn_and_an_index_pins_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ranks = [Team(rank=r, size=3, local_rank=r) for r in range(3)]
    assert [str(t.device(torch.device("cuda"))) for t in ranks] == ["cuda:0", "cuda:1", "cuda:0"]  # 2 share cuda:0
    assert {str(t.device(torch.device("cuda:1"))) for t in ranks} == {"cuda:1"}
    assert str(Team().device(torch.device("cuda"))) == "cuda"  # one process: the config's device as given


def test_longest_jobs_first_onto_the_least_loaded_rank():
    class Fixed(DistributedExecutor):
        def cost(self, job):
            return job

    executor = Fixed.__new__(Fixed)
    executor.team = Team(rank=0, size=2)
    # by cost: 7 -> r0 (0 | 0), 5 -> r1 (7 | 0), 4 -> r1 (7 | 5), 3 -> r0 (7 | 9), 1 -> r1 (10 | 9)
    assert executor.assign([3, 7, 1, 5, 4]) == [0, 0, 1, 1, 1]
    assert executor.shares == [10.0, 10.0]


def test_scores_from_tallies_of_any_split_equal_one_pass():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (103,), generator=g)
    batches = [[torch.randn(len(y[s:s + 10]), 5, generator=g) for _ in range(3)] for s in range(0, 103, 10)]
    whole = exit_scores(batches, y, 10, (2, 4, 6))
    tallies = [batch_tally(b, y[s:s + 10]) for s, b in zip(range(0, 103, 10), batches)]
    for cut in (0, 4, 11):  # rank 0's batches, then rank 1's, through the exchange's CPU copy
        gathered = to_cpu(tallies[:cut]) + to_cpu(tallies[cut:])
        assert tally_scores(gathered, len(y), (2, 4, 6)) == whole


# ---- whole runs ---------------------------------------------------------------------------------
METHODS = ["alllarge", "heterofl", "depthfl", "fedepth", "scalefl", "reefl"]


@pytest.mark.soak  # about 2 minutes; the kill-and-resume test below checks DepthFL's in make test
def test_two_processes_give_one_process_weights_and_scores_for_every_family_of_method(tmp_path, tiny_bert_dir):
    """AllLarge, HeteroFL (width), DepthFL (depth, FedDyn's per-client state), FeDepth (block-wise), ScaleFL (2-D,
    local accuracy) and ReeFL (tiny BERT): the same weights, bit for bit, and the same scores every round."""
    command = [sys.executable, str(HERE / "team_runs.py")]
    text = {"HETFL_MINILM_DIR": str(tiny_bert_dir)}
    alone = subprocess.run([*command, str(tmp_path / "one"), *METHODS], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", **text}, timeout=600)
    assert alone.returncode == 0, alone.stderr[-2000:]
    ranks = start_ranks(2, [*command, str(tmp_path / "two"), *METHODS], [text, text])
    outs = [r.communicate(timeout=600) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(METHODS)  # rank 1 made no folder
    for name in METHODS:
        one, two = tmp_path / "one" / name, tmp_path / "two" / name
        assert_same_weights(one, two)
        assert records(one) == records(two), name
    assert (tmp_path / "two" / "depthfl" / "client_state").is_dir()  # kept by rank 0 for every client


@pytest.mark.soak
def test_processes_flag_and_torchrun_give_one_process_weights(tmp_path):
    assert hetfl("run", *DIGITS, "--method", "heterofl", "--out", str(tmp_path / "one")).returncode == 0
    flag = hetfl("run", *DIGITS, "--method", "heterofl", "--out", str(tmp_path / "flag"), "--processes", "2")
    assert flag.returncode == 0, flag.stderr[-2000:]
    assert "global" in flag.stdout and flag.stdout.count("run folder") == 1  # rank 0 alone prints the table
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "hetfl", "run", *DIGITS, "--method", "heterofl", "--out", str(tmp_path / "tr")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert torchrun.returncode == 0, torchrun.stderr[-2000:]
    for other in ("flag", "tr"):
        assert_same_weights(only_run(tmp_path / "one"), only_run(tmp_path / other))
    summary = json.loads((only_run(tmp_path / "flag") / "summary.json").read_text())
    assert summary["segments"][0]["processes"] == 2


class EndedRank:
    """A rank that has already ended with ``code`` when the launcher first looks (negative: killed by a signal)."""

    def __init__(self, code: int):
        self.returncode = code

    def poll(self) -> int:
        return self.returncode


@pytest.mark.parametrize("codes, expected, line", [([-9, 1], 1, "rank 0 was killed by signal 9"),
                                                   ([0, 3], 3, None), ([0, 0], 0, None)])
def test_the_launcher_returns_the_first_failure_even_when_every_rank_ended_between_two_looks(monkeypatch, capsys,
                                                                                           codes, expected, line):
    # A killed rank 0 and the peer its watchdog ends at once can both be gone before the launcher's first look.
    ranks = iter(EndedRank(c) for c in codes)
    monkeypatch.setattr("hetfl.distributed.subprocess.Popen", lambda *a, **k: next(ranks))
    assert launch(len(codes), ["run"], rank_timeout=1) == expected
    err = capsys.readouterr().err
    assert (line in err) if line else not err


def test_a_run_killed_in_round_2_with_two_processes_resumes_with_one_to_the_same_weights(tmp_path):
    depthfl = [*DIGITS, "--method", "depthfl"]  # FedDyn: clients' own state must survive the kill exactly
    assert hetfl("run", *depthfl, "--out", str(tmp_path / "whole")).returncode == 0
    killed = hetfl("run", *depthfl, "--out", str(tmp_path / "cut"), "--processes", "2", "--rank-timeout", "5",
                   env={"HETFL_CRASH_AT": "round-logged:2"})  # rank 0 dies after logging round 2
    assert killed.returncode != 0
    assert "rank 0 was killed by signal 9" in killed.stderr
    run = only_run(tmp_path / "cut")
    assert not (run / "summary.json").exists()
    resumed = hetfl("run", "--resume", str(run), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_weights(only_run(tmp_path / "whole"), run)


@pytest.mark.parametrize("how", ["killed", pytest.param("hung", marks=pytest.mark.soak)])
def test_a_lost_rank_stops_its_peer_within_the_rank_timeout_naming_it(tmp_path, how):
    command = [sys.executable, "-m", "hetfl", "run", *DIGITS, "--rounds", "30", "--method", "alllarge",
               "--out", str(tmp_path), "--rank-timeout", "4"]
    crash = {"HETFL_CRASH_AT": "round-trained:2"} if how == "killed" else {}
    owner, peer = start_ranks(2, command, [{}, crash])
    if how == "hung":
        metrics = tmp_path.glob("*/metrics.jsonl")
        while not any(path.read_text() for path in metrics):  # rank 1 is mid-run: round 1 logged
            time.sleep(0.2)
            metrics = tmp_path.glob("*/metrics.jsonl")
            assert owner.poll() is None
        peer.send_signal(signal.SIGSTOP)
    else:
        peer.wait(timeout=120)
    lost = time.monotonic()
    _, err = owner.communicate(timeout=60)
    took = time.monotonic() - lost
    peer.kill()
    peer.communicate()
    assert owner.returncode == 1
    lines = [line for line in err.splitlines() if line.startswith("hetfl:")]
    assert len(lines) == 1 and "rank 0: lost rank 1" in lines[0] and "--resume" in lines[0], err[-2000:]
    assert took < 4 + 8, took  # the timeout, a heartbeat, and a slow machine's margin


def refuse_different_options(out: Path, hetfl_command: list[str]) -> None:
    """Starts two ranks of ``hetfl_command run ...`` whose --lr differs; asserts each refuses with one line, exit 2."""
    base = [*hetfl_command, "run", *DIGITS, "--method", "alllarge", "--out", str(out)]
    port = free_port()
    ranks = [subprocess.Popen([*base, "--lr", lr], env=rank_env(r, 2, port), text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r, lr in enumerate(["0.05", "0.1"])]
    errs = [r.communicate(timeout=120)[1] for r in ranks]
    assert [r.returncode for r in ranks] == [2, 2], errs
    assert errs[0].strip() == "hetfl: error: rank 1's option lr differs from rank 0's (0.1 against 0.05); start " \
                              "every rank with the same command, data and hetfl"
    assert errs[1].strip().startswith("hetfl: error: rank 1: rank 1's option lr differs")
    assert not list(out.iterdir())  # refused before any run folder


def test_ranks_with_different_options_refuse_to_start_with_one_line_each(tmp_path):
    refuse_different_options(tmp_path, [sys.executable, "-m", "hetfl"])


# hetfl with a watchdog that beats every 0.2 ms, so it is nearly always inside the store's C++ code
BUSY_WATCHDOG = "import sys; import hetfl.distributed as d; d.HEARTBEAT = 2e-4; from hetfl.cli import main; " \
                "sys.exit(main())"


def test_a_rank_ends_cleanly_even_when_its_watchdog_is_inside_the_store(tmp_path):
    """A daemon thread caught inside the store's C++ code when the interpreter finalizes aborts the process (SIGABRT,
    "terminate called without an active exception"): 8 of 12 such pairs did before ranks stopped their watchdog on
    every way out, and the refusal above did so once in CI with the normal one-second heartbeat."""
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        refuse_different_options(tmp_path / str(attempt), [sys.executable, "-c", BUSY_WATCHDOG])


def test_processes_flag_refuses_bad_counts_before_starting_anything(tmp_path):
    for count, why in (("0", "--processes must be at least 1, got 0"),):
        done = hetfl("run", *DIGITS, "--out", str(tmp_path), "--processes", count)
        assert done.returncode == 2 and done.stderr.strip() == f"hetfl: error: {why}"
    done = hetfl("run", *DIGITS, "--out", str(tmp_path), "--processes", "2", "--lr", "-1")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1  # the config is checked once, here
    assert not list(tmp_path.iterdir())


@pytest.mark.soak
def test_two_machines_on_loopback_give_one_process_weights(tmp_path):
    """``torchrun --nnodes 2`` (c10d rendezvous), one process per "machine", both on this one."""
    assert hetfl("run", *DIGITS, "--method", "scalefl", "--out", str(tmp_path / "one")).returncode == 0
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "soak",
                               "-m", "hetfl", "run", *DIGITS, "--method", "scalefl", "--out", str(tmp_path / "two")],
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    outs = [n.communicate(timeout=600) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert_same_weights(only_run(tmp_path / "one"), only_run(tmp_path / "two"))


COUNTS = "bench scaling: --processes takes comma-separated counts of at least 1, e.g. 1,2,4; got"


@pytest.mark.parametrize("args, why", [
    (["--processes", "0,2"], f"{COUNTS} '0,2'"),
    (["--processes", "two"], f"{COUNTS} 'two'"),
    (["--rounds", "2"], "bench scaling: --rounds must be at least 3 (a warm-up, a timed and an evaluated round), got 2"),
])
def test_bench_scaling_refuses_bad_counts_and_horizons_with_one_line(args, why):
    done = hetfl("bench", "scaling", *args)
    assert done.returncode == 2 and done.stderr.strip() == f"hetfl: error: {why}" and not done.stdout


def test_processes_is_an_option_of_bench_scaling_only():
    done = hetfl("bench", "speed", "--processes", "2")
    assert done.returncode == 2
    assert done.stderr.strip() == "hetfl: error: bench: --processes is an option of hetfl bench scaling"
