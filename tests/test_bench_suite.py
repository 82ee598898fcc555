"""``hetfl bench suite``: several presets within a time budget, stopped cleanly, resumed by the next call.

The timed calls run ``python -m hetfl`` in a subprocess, so the time asserted is the whole command's
(start-up, the workers' stop, the tables). ``--workers 2`` on this 2-core machine gives each worker one
thread: two threads per process slow a small model's rounds many times over when the cores are busy.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetfl.bench.runner import FINISHED
from hetfl.cli import main
from hetfl.errors import HetflError
from hetfl.machine import threads_each

CLEANUP = 10  # seconds past the budget: the interpreter's start-up (imports) and the tables at the end

LONG = """
title = "long"
seeds = [0]
[base]
dataset = "digits"
num_clients = 10
model_width = 0.25
client_fraction = 0.5
rounds = {rounds}
checkpoint_every = 1
[[runs]]
label = "only"
method = "alllarge"
"""


def suite(*args: str, budget: float, timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """The finished ``hetfl bench suite`` call and its wall time in seconds."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hetfl", "bench", "suite", "--time-budget", str(budget), "--quiet",
                           *args], capture_output=True, text=True, timeout=timeout or budget + 120)
    return done, time.monotonic() - started


@pytest.mark.soak
def test_demo_within_budget_and_a_second_call_completes_the_table(tmp_path):
    """The demo preset (one round per run: its 5 rounds take ~150 s here) within 60 s; the next call adds
    whatever was left and writes the table."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    where = ["--out", str(out), "--runs-dir", str(runs), "--rounds", "1", "--workers", "2"]
    first, seconds = suite("--device", "cpu", "demo", *where, budget=60)
    assert first.returncode == 0, first.stderr
    assert seconds < 60 + CLEANUP, first.stdout
    assert "runs finished in this call" in first.stdout
    second, _ = suite("demo", *where, budget=300)
    assert second.returncode == 0, second.stderr
    assert "runs left: 0;" in second.stdout
    table = (out / "demo" / "table.md").read_text()
    assert f"hetfl bench demo --out {out / 'demo'} --rounds 1" in table  # the command that regenerates it
    summaries = json.loads((out / "demo" / "summaries.json").read_text())
    assert sorted(summaries) == ["AllLarge", "AllSmall", "ExclusiveFL 25% (d)"]
    assert all(len(s) == 1 and s[0]["rounds"] == 1 and s[0]["accuracy"] is not None for s in summaries.values())
    assert not (out / "demo" / FINISHED).exists()  # summaries.json holds them all
    assert len(list(runs.glob("*-s0/summary.json"))) == 3  # each run trained once


@pytest.mark.parametrize("omp, expected", [("1", 1), ("3", 3), (None, "cores")])
def test_a_suite_worker_computes_with_omp_num_threads_where_it_is_set_else_with_its_share_of_the_cores(
        tmp_path, monkeypatch, omp, expected):
    """Beside a one-thread pilot on 2 cores, a one-worker suite that took both cores trained 3-4x slower than
    with the one it was told (OMP_NUM_THREADS=1): OpenMP's threads wait on each other at every kernel."""
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    preset = tmp_path / "one.toml"
    preset.write_text(LONG.format(rounds=1))
    done, _ = suite(str(preset), "--workers", "1", "--out", str(tmp_path / "out"), "--runs-dir",
                    str(tmp_path / "runs"), budget=120)
    assert done.returncode == 0, done.stderr
    (summary,) = (tmp_path / "runs").glob("*/summary.json")
    threads = {segment["threads"] for segment in json.loads(summary.read_text())["segments"]}
    assert threads == {len(os.sched_getaffinity(0)) if expected == "cores" else expected}


def test_omp_num_threads_that_is_no_count_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(HetflError, match="OMP_NUM_THREADS must be a positive number of threads, got 'two'"):
        threads_each(1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert [threads_each(n) for n in (1, len(os.sched_getaffinity(0)), 10**6)] == [
        len(os.sched_getaffinity(0)), 1, 1]


def rounds_lasting(seconds: float, folder: Path) -> int:
    """Rounds of ``LONG``'s run that take about ``seconds`` of training on this machine, from a 6-round run's median
    round (100 to 2,000): a fixed horizon that a slow machine needs 40 s for, a fast one finished within the 15 s
    call that must not finish it (as on CI's machine)."""
    preset = folder / "pace.toml"
    folder.mkdir()
    preset.write_text(LONG.format(rounds=6))
    done, _ = suite(str(preset), "--out", str(folder / "out"), "--runs-dir", str(folder / "runs"), budget=120)
    assert done.returncode == 0, done.stderr
    (metrics,) = (folder / "runs").glob("*/metrics.jsonl")
    pace = sorted(json.loads(line)["seconds"] for line in metrics.read_text().splitlines()[1:])[2]
    return min(2000, max(100, round(seconds / pace)))


@pytest.mark.soak
def test_a_small_budget_stops_the_worker_and_later_calls_resume(tmp_path):
    """A run longer than the budget is stopped before the budget ends and keeps its checkpoint; a call whose
    budget cannot hold the rest still advances it to its next checkpoints; a larger one finishes it and writes the
    table."""
    rounds = rounds_lasting(60, tmp_path / "pace")  # whatever this machine's speed: the 20 s and 15 s calls cannot
    preset = tmp_path / "long.toml"                   # finish it, a 300 s one can
    preset.write_text(LONG.format(rounds=rounds))
    out, runs = tmp_path / "out", tmp_path / "runs"
    where = [str(preset), "--out", str(out), "--runs-dir", str(runs), "--workers", "2"]

    first, seconds = suite(*where, budget=20)
    assert first.returncode == 0, first.stderr
    assert seconds < 20 + CLEANUP, first.stdout
    assert "long: 1 of 1 runs left" in first.stdout and "runs left: 1;" in first.stdout
    (run_dir,) = runs.glob("alllarge-*-s0")
    assert not (run_dir / "summary.json").exists() and (run_dir / "checkpoint" / "state.pt").exists()
    assert not (out / "long" / "table.md").exists()
    logged = (run_dir / "metrics.jsonl").read_text()

    # the rest of the run (its own rounds' pace x the rounds after its checkpoint) does not fit in 15 s, its next
    # checkpoint (a round away) does: it starts, to advance as far as it can, and is stopped in time
    second, seconds = suite(*where, budget=15)
    assert second.returncode == 0, second.stderr
    assert "resumed after round" in second.stdout and seconds < 15 + CLEANUP
    assert (run_dir / "metrics.jsonl").read_text().startswith(logged) and not (run_dir / "summary.json").exists()
    assert "estimated device-seconds left: 0" not in second.stdout

    third, _ = suite(*where, budget=300)
    assert third.returncode == 0, third.stderr
    assert "resumed after round" in third.stdout and "runs left: 0;" in third.stdout
    summaries = json.loads((out / "long" / "summaries.json").read_text())
    assert summaries["only"][0]["rounds"] == rounds and (out / "long" / "table.md").exists()
    logged = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, rounds + 1))


def _workers(pid: int) -> list[int]:
    """The suite workers whose parent is ``pid`` (Linux's /proc; not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:  # stat: "pid (name) state ppid ...", the name may hold spaces
            if (entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
                    and b"spawn_main" in (entry / "cmdline").read_bytes()):
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            pass
    return found


@pytest.mark.soak
def test_a_worker_stops_when_its_suite_process_is_killed(tmp_path):
    """kill -9 of the suite process (no finally, no SIGTERM to its workers): its worker stops itself within
    seconds (4 here, unloaded), not at the budget's end, and its run keeps its checkpoint for the next call."""
    import os
    import signal

    preset = tmp_path / "long.toml"
    preset.write_text(LONG.format(rounds=1000))  # never finished: the worker is stopped after round 1
    runs = tmp_path / "runs"
    suite_process = subprocess.Popen([sys.executable, "-m", "hetfl", "bench", "suite", str(preset), "--time-budget",
                                      "600", "--quiet", "--out", str(tmp_path / "out"), "--runs-dir", str(runs)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob("*/checkpoint/state.pt")) and time.monotonic() < deadline:
            time.sleep(0.5)  # the worker trains: it checkpointed round 1
        (worker,) = _workers(suite_process.pid)
        os.kill(suite_process.pid, signal.SIGKILL)
        suite_process.wait()
        deadline = time.monotonic() + 60  # a tenth of the budget: a loaded machine may take seconds to stop it
        while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]
    finally:
        suite_process.kill()
    assert list(runs.glob("*/checkpoint/state.pt")) and not list(runs.glob("*/summary.json"))


@pytest.mark.parametrize("args,fragment", [
    (["demo"], "bench suite: --time-budget SECONDS is required"),
    (["--time-budget", "60"], "bench suite: name at least one preset"),
    (["--time-budget", "0", "demo"], "--time-budget must be a number of seconds > 0, not 0"),
    (["--time-budget", "-5", "demo"], "--time-budget must be a number of seconds > 0, not -5"),
    (["--time-budget", "nan", "demo"], "--time-budget must be a number of seconds > 0, not nan"),
    (["--time-budget", "inf", "demo"], "--time-budget must be a number of seconds > 0, not inf"),
    (["--time-budget", "soon", "demo"], "argument --time-budget: invalid float value: 'soon'"),
    (["--time-budget", "60", "--workers", "0", "demo"], "--workers must be an integer >= 1, got 0"),
    (["--time-budget", "60", "--workers", "two", "demo"], "argument --workers: invalid int value: 'two'"),
    (["--time-budget", "60", "demo", "nope"], "bench preset 'nope' is unknown; choose one of"),
    (["--time-budget", "60", "demo", "speed"], "'speed' is a benchmark of its own: hetfl bench speed"),
    (["--time-budget", "60", "demo", "demo"], "preset 'demo' is named twice"),
    (["--time-budget", "60", "--seeds", "0,x", "demo"], "--seeds must be comma-separated integers, got '0,x'"),
    (["--time-budget", "60", "--rounds", "0", "demo"], "rounds must be an integer >= 1, got 0"),
    (["--time-budget", "60", "--device", "tpu", "demo"], "device 'tpu' is not a torch device"),
    (["--time-budget", "60", "--report-only", "demo"], "--report-only is an option of hetfl bench PRESET"),
    (["--time-budget", "60", "--colour", "red", "demo"], "unrecognized arguments: --colour"),
    (["--time-budget", "60", "--order", "longest", "demo"],
     "--order must be one of shortest, given, claims, not 'longest'"),
])
def test_bad_suite_input(tmp_path, capsys, args, fragment):
    out, runs = tmp_path / "out", tmp_path / "runs"
    code = main(["bench", "suite", *args, "--out", str(out), "--runs-dir", str(runs)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("hetfl: error:"), err
    assert fragment in err[0], err[0]
    assert not out.exists() and not runs.exists()


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "out").write_text("")
    assert main(["bench", "suite", "demo", "--time-budget", "60", "--out", str(tmp_path / "out"),
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "--out" in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,fragment", [
    (["demo", "extra"], "hetfl: error: unrecognized arguments: extra"),
    (["demo", "--workers", "2"], "--workers, --time-budget, --plan, --order and --whole-runs are options"),
    (["demo", "--time-budget", "60"], "--workers, --time-budget, --plan, --order and --whole-runs are options"),
    (["demo", "--order", "given"], "--workers, --time-budget, --plan, --order and --whole-runs are options"),
    (["demo", "--whole-runs"], "--workers, --time-budget, --plan, --order and --whole-runs are options"),
    ([], "hetfl: error: bench: the following arguments are required: preset"),
])
def test_other_benches_take_one_preset_and_no_suite_options(tmp_path, capsys, args, fragment):
    assert main(["bench", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


TWO_ROWS = """
title = "two rows"
seeds = [0]
[base]
dataset = "digits"
num_clients = 10
model_width = 0.25
client_fraction = 0.3
rounds = 1
[[runs]]
label = "large"
method = "alllarge"
"""


def test_reuse_saved_trains_only_the_runs_a_committed_table_lacks(tmp_path, capsys):
    """A suite on a fresh machine (no runs folder) with --reuse-saved takes the runs the results folder holds and
    trains only the new row; the table then has both, the saved one unchanged."""
    preset = tmp_path / "rows.toml"
    preset.write_text(TWO_ROWS)
    out = tmp_path / "out"
    assert main(["bench", str(preset), "--out", str(out / "rows"), "--runs-dir", str(tmp_path / "old-runs"),
                 "--quiet"]) == 0
    (saved,) = json.loads((out / "rows" / "summaries.json").read_text())["large"]
    preset.write_text(TWO_ROWS + '[[runs]]\nlabel = "small"\nmethod = "allsmall"\n')
    fresh = tmp_path / "runs"
    assert main(["bench", "suite", str(preset), "--time-budget", "300", "--out", str(out), "--runs-dir", str(fresh),
                 "--reuse-saved", "--quiet"]) == 0
    assert [p.name.split("-")[0] for p in fresh.glob("*-s0")] == ["allsmall"]  # the saved row is not trained again
    summaries = json.loads((out / "rows" / "summaries.json").read_text())
    assert summaries["large"] == [saved] and summaries["small"][0]["rounds"] == 1
    assert "runs finished in this call: 1;" in capsys.readouterr().out
    assert not (out / "rows" / FINISHED).exists()  # summaries.json holds them all
    # the complete table named again, for one seed: left as it is (its regenerate line names no --seeds)
    table = (out / "rows" / "table.md").read_text()
    assert main(["bench", "suite", str(preset), "--time-budget", "60", "--out", str(out), "--runs-dir", str(fresh),
                 "--reuse-saved", "--seeds", "0", "--quiet"]) == 0
    assert "its table already holds them" in capsys.readouterr().out
    assert (out / "rows" / "table.md").read_text() == table
    # a call with no time to train the row added records nothing the table already holds
    preset.write_text(preset.read_text() + '[[runs]]\nlabel = "exclusive"\nmethod = "exclusivefl"\n')
    assert main(["bench", "suite", str(preset), "--time-budget", "1", "--out", str(out), "--runs-dir", str(fresh),
                 "--reuse-saved", "--quiet"]) == 0
    assert not (out / "rows" / FINISHED).exists()
    assert json.loads((out / "rows" / "summaries.json").read_text()) == summaries


# loaded at every interpreter's start (PYTHONPATH): in the suite process and in each spawned worker, a bug in one
# method's run, as FeDepth's CPU-made example batch on a CUDA model was
CRASH_ALLSMALL = """
import hetfl.bench.runner as runner

real = runner.run_one


def run_one(cfg, progress):
    if cfg.method == "allsmall":
        raise RuntimeError("a bug in this run")
    return real(cfg, progress)


runner.run_one = run_one
"""


def test_a_run_that_fails_is_tried_once_and_its_worker_replaced_so_the_other_runs_finish(tmp_path):
    """One worker, the failing run first: it ends the worker, a new worker takes the other two runs and no worker
    tries the failed one again; the call exits 1 naming it (before, every worker in turn took the failed run and
    died with it: 14 of 16 workers on a GPU)."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(CRASH_ALLSMALL)
    preset = tmp_path / "rows.toml"
    preset.write_text(TWO_ROWS.replace('label = "large"\nmethod = "alllarge"',
                                       'label = "small"\nmethod = "allsmall"\n[[runs]]\nlabel = "large"\n'
                                       'method = "alllarge"\n[[runs]]\nlabel = "exclusive"\nmethod = "exclusivefl"'))
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "hetfl", "bench", "suite", str(preset), "--time-budget", "300",
                           "--workers", "1", "--order", "given", "--out", str(tmp_path / "out"), "--runs-dir",
                           str(runs), "--quiet"], capture_output=True, text=True, timeout=420,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "inject"), "OMP_NUM_THREADS": "1"})
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert log.count("RuntimeError: a bug in this run") == 1 and log.count("small, seed 0: failed;") == 1, log
    assert "rows small, seed 0 (allsmall-" in log and "failed and was not retried in this call" in log
    assert "runs finished in this call: 2; runs left: 1;" in log, log
    assert sorted(p.parent.name.split("-")[0] for p in runs.glob("*/summary.json")) == ["alllarge", "exclusivefl"]


def test_estimates_take_a_run_s_own_pace_only_from_enough_rounds_on_this_device(tmp_path):
    """The module's rules, on hand-made run folders: few rounds of its own yield to its siblings' pace, the
    rounds timed on cuda never estimate a run going on on the CPU, and the pace of another method, or of
    the same method with another recipe, never estimates a run."""
    from dataclasses import fields

    import torch

    from hetfl.bench.suite import ROUND_NEUTRAL
    from hetfl.config import Config

    assert ROUND_NEUTRAL < {f.name for f in fields(Config)}  # each a field
    from hetfl.bench.suite import OWN_PACE_ROUNDS, Job, estimate
    from hetfl.methods import config_from

    def job(name, seed, label="A", method="alllarge", **options):
        cfg = config_from(dict(dataset="digits", rounds=20, seed=seed, out=str(tmp_path), name=name, method=method,
                               **options))
        (tmp_path / name).mkdir(exist_ok=True)
        return Job(cfg, labels=[("p", label)])

    def logged(name, seconds, checkpoint=0, segments=()):
        lines = [json.dumps({"round": r, "seconds": s}) for r, s in enumerate(seconds, 1)]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        if checkpoint:
            (tmp_path / name / "checkpoint").mkdir(exist_ok=True)
            torch.save({"round": checkpoint, "segments": list(segments)}, tmp_path / name / "checkpoint" / "state.pt")

    sibling, few, many, gpu, fresh = (job("sib", 0), job("few", 1), job("many", 2), job("gpu", 3),
                                      job("fresh", 4, label="B"))
    jobs = [sibling, few, many, gpu, fresh]
    finished = {"sib": {"wall_seconds": 200.0, "rounds": 20, "device": "cpu"}}  # 10 s a round
    logged("few", [90.0, 90.0], checkpoint=1)  # two rounds under contention: its siblings' pace, for 19 rounds
    assert estimate(few, jobs, finished) == pytest.approx(10 * 19)
    assert estimate(few, jobs, {}) == pytest.approx(90 * 19)  # nothing else known: its own
    logged("many", [20.0] * OWN_PACE_ROUNDS, checkpoint=4)  # enough of its own: 20 s a round, 16 rounds left
    assert estimate(many, jobs, finished) == pytest.approx(20 * 16)
    logged("many", [20.0] * (OWN_PACE_ROUNDS - 1) + [1400.0, 20.0], checkpoint=4)  # a round that held a pause
    assert estimate(many, jobs, finished) == pytest.approx(20 * 16)
    cuda_then_cpu = [{"from_round": 1, "device": "cuda:0"}, {"from_round": 7, "device": "cpu"}]
    logged("gpu", [1.0] * 6 + [30.0] * 4, checkpoint=10, segments=cuda_then_cpu)
    # 4 CPU rounds: too few; its siblings': the finished one's 10 s and the unfinished one's own 20 s
    assert estimate(gpu, jobs, finished) == pytest.approx(15 * 10)
    assert estimate(gpu, [gpu], {}) == pytest.approx(30 * 10)  # alone: its own few, never cuda's 1 s
    assert estimate(fresh, jobs, finished) == pytest.approx(15 * 20)  # the same work per round, another label
    tuned = job("tuned", 6, label="D", lr=0.2, lr_schedule="cosine", partition="dirichlet", alpha=1.0)
    assert estimate(tuned, [*jobs, tuned], finished) == pytest.approx(15 * 20)  # another step size and split
    feddyn = job("feddyn", 7, label="E", server_opt="feddyn")  # the same method, another recipe: not its pace
    assert estimate(feddyn, [*jobs, feddyn], finished) is None
    assert estimate(fresh, [fresh, few, sibling], finished) == pytest.approx(10 * 20)  # few's 2 rounds: nothing
    assert estimate(fresh, [fresh, few], {}) is None
    other = job("other", 5, label="C", method="depthfl")  # its preset's, of another method: not its pace
    assert estimate(other, [*jobs, other], finished) is None
    (tmp_path / "gpu" / "config.json").write_text(json.dumps({"device": "cuda"}))  # an older GPU run: began
    logged("gpu", [1.0] * 8, checkpoint=8, segments=[{"from_round": 1}])  # there, its segments name no device
    assert estimate(gpu, [gpu], {}) is None
    assert estimate(fresh, [fresh, gpu], {}) is None  # nor do they estimate another run on the CPU
    mixed = {"wall_seconds": 150.0, "rounds": 20, "device": "cpu", "segments": [  # 10 rounds there, 10 here
        {"from_round": 1, "device": "cuda", "elapsed_before": 0.0},
        {"from_round": 11, "device": "cpu", "elapsed_before": 50.0}]}
    assert estimate(fresh, [fresh, sibling], {"sib": mixed}) == pytest.approx(10 * 20)  # its CPU rounds' pace only


def test_the_plan_follows_the_workers_rules(tmp_path):
    """Three runs of 200 s (their label's pace) on two workers: the third finishes, is cut short or waits, as the
    budget allows; a run whose estimate misses the budget whole is put aside until its worker's pass ends."""
    from hetfl.bench.suite import Job, plan
    from hetfl.methods import config_from

    def job(seed):
        return Job(config_from(dict(dataset="digits", rounds=20, seed=seed, out=str(tmp_path), name=f"r{seed}")),
                   labels=[("p", "A")])

    jobs = [job(seed) for seed in range(4)]
    known = {"r0": {"wall_seconds": 200.0, "rounds": 20}}  # 10 s a round: 200 s a run

    def outcomes(budget):
        return [(p.job.cfg.name, p.start, p.end) for p in plan(jobs, known, tmp_path, budget, workers=2)]

    assert outcomes(500) == [("r1", 0, 205), ("r2", 0, 205), ("r3", 205, 410)]  # 5 s: a run's start
    assert outcomes(400) == [("r1", 0, 205), ("r2", 0, 205), ("r3", 205, None)]  # cut short: reaches round 1
    assert outcomes(100) == [("r1", 0, None), ("r2", 0, None), ("r3", None, None)]  # no room for a third


def test_whole_runs_start_only_what_finishes(tmp_path, capsys):
    """``--whole-runs`` (a runs folder that goes with the job): the budget's end is left idle rather than spent on
    the start of a run it would cut short, and a run without an estimate does not start, in the plan and in a
    worker alike."""
    from hetfl.bench.suite import Job, _train_if_it_fits, plan
    from hetfl.methods import config_from

    def job(seed, method="alllarge", label="A"):
        return Job(config_from(dict(dataset="digits", rounds=20, seed=seed, out=str(tmp_path), name=f"r{seed}",
                                    method=method)), labels=[("p", label)])

    jobs = [job(seed) for seed in range(4)]
    known = {"r0": {"wall_seconds": 200.0, "rounds": 20}}  # 10 s a round: 200 s a run

    def outcomes(budget, jobs=jobs):
        return [(p.job.cfg.name, p.start, p.end) for p in plan(jobs, known, tmp_path, budget, 2, whole=True)]

    assert outcomes(500) == [("r1", 0, 205), ("r2", 0, 205), ("r3", 205, 410)]
    assert outcomes(400) == [("r1", 0, 205), ("r2", 0, 205), ("r3", None, None)]  # not started: would be cut
    assert outcomes(100) == [("r1", None, None), ("r2", None, None), ("r3", None, None)]
    odd = job(9, method="depthfl", label="D")  # another method: no estimate
    assert outcomes(10_000, [*jobs, odd])[-1] == ("r9", None, None)
    deferred = []
    for j, stop in ((jobs[1], time.monotonic() + 100), (odd, time.monotonic() + 10_000)):
        _train_if_it_fits(j, jobs, tmp_path, stop, known, deferred, partial=False, progress=False, worker=1,
                          whole=True)
    assert deferred == [] and not (tmp_path / "r1").exists() and not (tmp_path / "r9").exists()
    assert capsys.readouterr().out.splitlines() == [
        "[suite 1] p A, seed 1: not started, 100 s left: too few for its estimated 200 s",
        "[suite 1] p D, seed 9: not started, no estimate (--whole-runs starts only runs that finish)"]


def test_shortest_first_finishes_the_most_runs_and_given_keeps_the_presets_order(tmp_path):
    """A 400 s run and a run of another method (no estimate: FedDF's case) before three 100 s runs, 340 s on one
    worker: shortest first finishes the three short runs and gives the rest of the time to the unknown run; the
    given order puts the long run aside (it can reach its first checkpoint) and lets the unknown one hold the
    worker from the start: none finishes."""
    from hetfl.bench.suite import Job, plan
    from hetfl.methods import config_from

    def job(name, label, method="alllarge"):
        return Job(config_from(dict(dataset="digits", rounds=20, seed=int(name[-1]), out=str(tmp_path), name=name,
                                    method=method)), labels=[("p", label)])

    jobs = [job("long1", "L"), job("odd1", "O", method="depthfl"), *(job(f"short{s}", "S") for s in (1, 2, 3))]
    jobs += [job("long0", "L"), job("short0", "S")]  # their finished siblings: 20 s and 5 s a round
    known = {"long0": {"wall_seconds": 400.0, "rounds": 20}, "short0": {"wall_seconds": 100.0, "rounds": 20}}

    def outcomes(order):
        return [(p.job.cfg.name, p.start, p.end) for p in plan(jobs, known, tmp_path, 340, 1, order)]

    assert outcomes("shortest") == [("short1", 0, 105), ("short2", 105, 210), ("short3", 210, 315),
                                    ("long1", None, None), ("odd1", 315, None)]
    assert outcomes("given") == [("long1", None, None), ("odd1", 0, None), ("short1", None, None),
                                 ("short2", None, None), ("short3", None, None)]


def test_claims_order_runs_the_claim_cheapest_to_decide_first(tmp_path):
    """``--order claims`` on four rows: "large beats small" needs small's two 100 s seeds (200 s), "large beats
    slow" slow's 400 s seed; small's runs go first, then slow's, then the quick row no claim compares, though
    shortest first would start with it; a claim with a run of unknown cost waits behind the others; a cost claim
    compares no runs."""
    from hetfl.bench.suite import Job, Planned, claim_runs, claims_first, in_order, load_suite

    preset = tmp_path / "rows.toml"
    preset.write_text(TWO_ROWS.replace("seeds = [0]", "seeds = [0, 1]") + """
[[runs]]
label = "small"
method = "allsmall"
[[runs]]
label = "slow"
method = "exclusivefl"
[[runs]]
label = "quick"
method = "depthfl"
[[claims]]
claim = "large beats slow"
better = "large"
worse = "slow"
[[claims]]
claim = "large beats small"
better = "large"
worse = "small"
[[claims]]
claim = "large is smaller"
better = "large"
cost_ratio = ["global", "level2"]
cost = "params"
at_least = 1.0
""")
    (suite,) = load_suite([str(preset)], str(tmp_path / "out"), tmp_path / "runs", {}, None)
    names = {(label, seed): cfg.name for label, seed, cfg in suite.configs}
    assert claim_runs([suite]) == [frozenset({names["large", 0], names["large", 1], names["slow", 0],
                                              names["slow", 1]}),
                                   frozenset({names["large", 0], names["large", 1], names["small", 0],
                                              names["small", 1]})]
    jobs = {cfg.name: Job(cfg) for _, _, cfg in suite.configs}
    need = {"small": 100.0, "slow": 400.0, "quick": 50.0}
    left = [Planned(jobs[names[label, seed]], seconds, "") for label, seconds in need.items() for seed in (0, 1)
            if (label, seed) != ("slow", 1)]  # large and slow's seed 1 have finished
    order = [(label, seed) for p in in_order(left, "claims", claim_runs([suite]))
             for (label, seed), name in names.items() if name == p.job.cfg.name]
    assert order == [("small", 0), ("small", 1), ("slow", 0), ("quick", 0), ("quick", 1)]
    shortest = in_order(left, "shortest")
    assert shortest[0].job.cfg.name == names["quick", 0]
    cheap = [Planned(p.job, 10.0 if p.need == 400.0 else p.need, "") for p in shortest]  # slow0: now 10 s
    assert [p.need for p in in_order(cheap, "claims", claim_runs([suite]))] == [10.0, 100.0, 100.0, 50.0, 50.0]
    unknown = Planned(jobs[names["slow", 1]], None, "")  # a run without an estimate: its claim waits
    assert [p.need for p in claims_first([*cheap, unknown], claim_runs([suite]))] == [
        100.0, 100.0, 10.0, None, 50.0, 50.0]


def test_a_plan_at_another_horizon_takes_the_pace_of_the_table_as_it_is(tmp_path, capsys):
    """``--rounds`` asks what a committed table would cost run longer: a row's runs in its summaries.json give
    their pace per round; a new row of another method has none, and the totals say so."""
    preset = tmp_path / "rows.toml"
    preset.write_text(TWO_ROWS)
    out, runs = tmp_path / "out", tmp_path / "runs"
    assert main(["bench", str(preset), "--out", str(out / "rows"), "--runs-dir", str(runs), "--quiet"]) == 0
    (saved,) = json.loads((out / "rows" / "summaries.json").read_text())["large"]
    preset.write_text(TWO_ROWS + '[[runs]]\nlabel = "small"\nmethod = "allsmall"\n')
    capsys.readouterr()
    assert main(["bench", "suite", str(preset), "--rounds", "30", "--plan", "--time-budget", "100000",
                 "--workers", "2", "--out", str(out), "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    need = saved["wall_seconds"] / saved["rounds"] * 30
    assert lines[1].startswith(f"[plan] rows large, seed 0, {need:.0f} s (its label's runs on cpu): from 0 s")
    assert lines[2] == "[plan] rows small, seed 0, no estimate: from 0 s: cut short at the stop, its checkpoints kept"
    assert lines[-1] == f"[plan] the runs left need {need:.0f} s of one worker by their estimates, and 1 run has none"
    assert [p.name.split("-")[0] for p in runs.glob("*-s0")] == ["alllarge"]  # nothing trained
    # an interim table's runs (finished-runs.json, by run folder name) price it too
    (out / "rows" / "summaries.json").unlink()
    (out / "rows" / FINISHED).write_text(json.dumps({Path(saved["run_dir"]).name: saved}))
    assert main(["bench", "suite", str(preset), "--rounds", "30", "--plan", "--time-budget", "100000",
                 "--workers", "2", "--out", str(out), "--runs-dir", str(runs)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == lines[1]


def test_a_plan_trains_nothing_and_may_name_a_device_this_machine_lacks(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "suite", "demo", "--device", "cuda", "--workers", "4", "--time-budget", "600", "--plan",
                 "--out", str(tmp_path / "out"), "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[plan] 4 worker(s), 600 s on cuda, if every estimate held:"
    assert lines[-2] == "[plan] 0 of 3 runs left would finish, 3 would be cut short, 0 not started"  # no estimate
    assert lines[-1] == "[plan] the runs left need 0 s of one worker by their estimates, and 3 runs have none"
    assert not runs.exists() and not (tmp_path / "out").exists()
