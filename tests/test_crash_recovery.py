"""Run folders survive kills, races and damaged files.

Kills are real: a `hetfl run` subprocess gets SIGKILL, either from the test at a moment it waits
for, or from itself at a named point (HETFL_CRASH_AT, see hetfl.rundir) when the moment is a
few microseconds wide (between two renames). Runs that are compared weight for weight all run in
subprocesses with one thread: CPU kernels may sum in another order on more threads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetfl.cli import main
from hetfl.config import Config
from hetfl.methods import config_from
from weights import assert_identical, weights
from hetfl.rundir import STALE_SECONDS
from hetfl.sim import Simulation

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROUNDS = 6
TIMEOUT = 120  # seconds for any one subprocess; a tiny digits run takes a few


def small_cfg(out: Path, **changes) -> Config:
    """DepthFL (FedDyn client state on disk) on digits, a few seconds per run; checkpoints after rounds 1, 2, 4, 6."""
    base = dict(method="depthfl", dataset="digits", model_width=0.25, num_clients=20, client_fraction=0.25,
                rounds=ROUNDS, batch_size=16, checkpoint_every=2, out=str(out))
    return config_from({**base, **changes})


def flags(cfg: Config) -> list[str]:
    """``cfg`` as `hetfl run` flags."""
    out = []
    for k, v in cfg.to_dict().items():
        if isinstance(v, list):
            v = ",".join(map(str, v))
        if v != "":
            out.append(f"--{k.replace('_', '-')}={v}")
    return out


def hetfl(*args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    """The finished `hetfl ARGS` process (SIGKILLing itself at ``crash``, a crash point[:N])."""
    env = {**ENV, "HETFL_CRASH_AT": crash} if crash else ENV
    return subprocess.run([sys.executable, "-m", "hetfl", *args], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


def start(cfg: Config) -> subprocess.Popen:
    """A `hetfl run` of ``cfg`` running in the background."""
    return subprocess.Popen([sys.executable, "-m", "hetfl", "run", "--quiet", *flags(cfg)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_after_rounds(proc: subprocess.Popen, run_dir: Path, rounds: int) -> int:
    """SIGKILL ``proc`` once ``rounds`` rounds are logged; returns the complete rounds logged by then."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= rounds:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait(TIMEOUT)
    proc.stderr.close()
    return metrics.read_text().count("\n")


def resume_ok(run_dir: Path, crash: str | None = None) -> subprocess.CompletedProcess:
    done = hetfl("run", "--resume", str(run_dir), "--quiet", crash=crash)
    assert done.returncode == 0, done.stderr
    return done


def logged_rounds(run_dir: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def checkpoint_round(run_dir: Path) -> int | None:
    """The round of the checkpoint a resume would use (checkpoint, else checkpoint.old), or None."""
    for folder in ("checkpoint", "checkpoint.old"):
        if (run_dir / folder / "state.pt").exists():
            return int(torch.load(run_dir / folder / "state.pt", weights_only=True)["round"])
    return None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The final weights of an uninterrupted run of ``small_cfg``."""
    out = tmp_path_factory.mktemp("reference")
    done = hetfl("run", "--quiet", *flags(small_cfg(out, name="whole")))
    assert done.returncode == 0, done.stderr
    return weights(out / "whole")


def killed_at(tmp_path: Path, point: str | None, **changes) -> Path:
    """The folder of a run of ``small_cfg`` that SIGKILLed itself at crash point ``point`` (None: that finished)."""
    cfg = small_cfg(tmp_path / "runs", name="killed", **changes)
    done = hetfl("run", "--quiet", *flags(cfg), crash=point)
    assert done.returncode == (-signal.SIGKILL if point else 0), (done.returncode, done.stderr)
    return tmp_path / "runs" / "killed"


# ---- 1. a kill at any step of a checkpoint's rename sequence ----------------------------------------------
@pytest.mark.parametrize("point,left", [
    ("checkpoint:written:2", {"checkpoint", "checkpoint.tmp"}),           # round 2's checkpoint written, not swapped in
    ("checkpoint:moved-to-old:1", {"checkpoint.old", "checkpoint.tmp"}),  # between the two renames
    ("checkpoint:renamed:2", {"checkpoint", "checkpoint.old"}),           # swapped in, the old one not yet deleted
    ("checkpoint:old-half-deleted:1", {"checkpoint", "checkpoint.old"}),  # killed while deleting checkpoint.old
])
@pytest.mark.soak  # a process killed at each step of the checkpoint swap: about 70 s
def test_kill_during_a_checkpoint_then_resume_gives_the_same_weights(tmp_path, reference, point, left):
    run = killed_at(tmp_path, point)
    assert left <= {p.name for p in run.iterdir()}
    resume_ok(run)  # and every later checkpoint (rounds 4 and 6) is written: the old bug failed there
    assert_identical(reference, weights(run))
    assert not (run / "checkpoint.old").exists() and not (run / "checkpoint.tmp").exists()
    assert logged_rounds(run) == list(range(1, ROUNDS + 1))


def test_resume_with_a_half_deleted_checkpoint_old_writes_its_next_checkpoint(tmp_cfg_run):
    """The state a kill while deleting checkpoint.old leaves: a non-empty checkpoint.old beside checkpoint."""
    run = tmp_cfg_run(stop_after=2)
    shutil.copytree(run / "checkpoint" / "client_state", run / "checkpoint.old" / "client_state")
    assert main(["run", "--resume", str(run), "--quiet"]) == 0  # used to fail: OSError: Directory not empty
    assert not (run / "checkpoint.old").exists()
    assert checkpoint_round(run) == 4


@pytest.fixture
def tmp_sim(tmp_path):
    """A 4-round ``small_cfg`` simulation run in this process up to ``stop_after`` rounds."""

    def make(stop_after: int | None, **changes) -> Simulation:
        sim = Simulation(small_cfg(tmp_path / "runs", name="r", rounds=4, **changes))
        sim.run(progress=False, stop_after=stop_after)
        return sim

    return make


@pytest.fixture
def tmp_cfg_run(tmp_sim):
    """The folder of a 4-round ``small_cfg`` run stopped after ``stop_after`` rounds."""
    return lambda stop_after, **changes: tmp_sim(stop_after, **changes).run_dir


# ---- 2. final files written atomically, model first; resume repairs them ------------------------------------
@pytest.mark.parametrize("point", ["write:final_model.pt", "write:summary.json"])
def test_kill_during_the_final_writes_then_resume_finishes_the_run(tmp_path, reference, point):
    run = killed_at(tmp_path, point)
    assert not (run / "summary.json").exists()  # no summary without a complete model: the model goes first
    assert list(run.glob(".*.tmp"))  # the kill came between the write and the rename
    resume_ok(run)
    assert_identical(reference, weights(run))
    assert json.loads((run / "summary.json").read_text())["rounds"] == ROUNDS
    assert not list(run.glob(".*.tmp"))  # the resume removed what the kill left


def test_resume_repairs_a_truncated_final_model(tmp_sim):
    """What a kill during the old in-place write left: summary.json and half a final_model.pt."""
    run = tmp_sim(stop_after=None).run_dir
    model = run / "final_model.pt"
    whole = weights(run)
    model.write_bytes(model.read_bytes()[:1000])
    assert main(["run", "--resume", str(run), "--quiet"]) == 0  # used to say "finished" and keep it truncated
    assert_identical(whole, weights(run))


def test_resume_of_a_finished_run_changes_nothing(tmp_sim, capsys):
    run = tmp_sim(stop_after=None).run_dir
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "exit4" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before


# ---- 3. a partial last line of metrics.jsonl -----------------------------------------------------------------
def test_partial_last_metrics_line_is_dropped_on_resume_and_skipped_by_plot(tmp_cfg_run, capsys):
    run = tmp_cfg_run(stop_after=3)
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + whole.splitlines()[-1][:40])  # round 4 being appended when killed
    assert main(["plot", str(run), "--out", str(run / "c.png")]) == 0
    assert "partial last line" in capsys.readouterr().err
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "partial last line" in capsys.readouterr().err
    assert logged_rounds(run) == [1, 2, 3, 4]


# ---- 4. a damaged client state file ---------------------------------------------------------------------------
@pytest.mark.parametrize("damage,lost", [
    (lambda text: text[:len(text.splitlines()[0]) + 30], [2, 3]),  # truncated inside round 2's line
    (None, [1, 2, 3]),                                                # deleted
])
def test_resume_names_the_rounds_whose_metrics_were_lost_and_summary_records_them(tmp_path, tmp_cfg_run, capsys,
                                                                                  damage, lost):
    """Checkpointed after round 3, then metrics.jsonl damaged: the resume finishes with the uninterrupted run's
    weights, says on one stderr line exactly which rounds' records are gone, and summary.json lists them."""
    whole = Simulation(small_cfg(tmp_path / "whole", name="w", rounds=4, checkpoint_every=1))
    whole.run(progress=False)
    run = tmp_cfg_run(stop_after=3, checkpoint_every=1)
    metrics = run / "metrics.jsonl"
    if damage is None:
        metrics.unlink()
    else:
        metrics.write_text(damage(metrics.read_text()))
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hetfl: warning: "), err
    assert f"rounds {lost[0]}..3 " in err[0] and "metrics_lost_rounds" in err[0], err[0]
    assert json.loads((run / "summary.json").read_text())["metrics_lost_rounds"] == lost
    assert logged_rounds(run) == [r for r in range(1, 5) if r not in lost]
    assert_identical(weights(whole.run_dir), weights(run))
    assert "metrics_lost_rounds" not in json.loads((whole.run_dir / "summary.json").read_text())


def test_truncated_client_state_in_the_checkpoint_is_a_one_line_error(tmp_sim, capsys):
    sim = tmp_sim(stop_after=2)  # checkpoint at round 2, whose client files are links to the live ones
    run = sim.run_dir
    later = set(sim.sample_clients(3)) | set(sim.sample_clients(4))  # so the old code did trip over it
    victim = next(f for f in sorted((run / "checkpoint" / "client_state").glob("*.pt")) if int(f.stem) in later)
    victim.write_bytes(victim.read_bytes()[:200])  # truncated in place: the live file and the snapshot alike
    assert main(["run", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and victim.name in err and "client state file" in err


def test_truncated_live_client_state_is_restored_from_the_snapshot(tmp_cfg_run):
    run = tmp_cfg_run(stop_after=3)  # round 3 rewrote its clients' files after the round-2 checkpoint
    snapshot = {f.name for f in (run / "checkpoint" / "client_state").glob("*.pt")}
    newer = [f for f in (run / "client_state").glob("*.pt")
             if f.name in snapshot and not os.path.samefile(f, run / "checkpoint" / "client_state" / f.name)]
    assert newer
    newer[0].write_bytes(newer[0].read_bytes()[:200])
    sim = Simulation.resume(run)
    assert sim.client_store.load(int(newer[0].stem)) is not None
    sim.run(progress=False)


# ---- 5. checkpoints after round 1 and by time: a kill loses little -----------------------------------------
def test_kill_before_the_first_periodic_checkpoint_resumes_from_a_checkpoint(tmp_path, reference):
    cfg = small_cfg(tmp_path / "runs", name="killed", checkpoint_every=100)  # none by rounds before the end
    run = tmp_path / "runs" / "killed"
    done = kill_after_rounds(start(cfg), run, 3)
    assert done < ROUNDS and checkpoint_round(run) is not None and checkpoint_round(run) >= 1
    resume_ok(run)
    assert_identical(reference, weights(run))  # checkpointing never changes the results


def test_checkpoint_by_time_loses_at_most_the_round_in_flight(tmp_path):
    cfg = small_cfg(tmp_path / "runs", name="killed", rounds=30, checkpoint_every=100, checkpoint_seconds=1e-6)
    run = tmp_path / "runs" / "killed"
    done = kill_after_rounds(start(cfg), run, 4)
    assert checkpoint_round(run) >= done - 1  # round `done`'s checkpoint may have been in flight


def test_checkpoint_schedule(tiny_cfg):
    sim = Simulation(tiny_cfg(rounds=12, checkpoint_every=5, checkpoint_seconds=60))
    assert [t for t in range(1, 13) if sim.checkpoint_due(t, since_last=0.0)] == [1, 5, 10, 12]
    assert sim.checkpoint_due(3, since_last=60.0) and not sim.checkpoint_due(3, since_last=59.0)
    sim = Simulation(tiny_cfg(rounds=12, checkpoint_every=5, checkpoint_seconds=0))
    assert not sim.checkpoint_due(3, since_last=1e9)


def test_kill_before_any_checkpoint_restarts_from_round_1(tmp_path, reference):
    run = killed_at(tmp_path, "checkpoint:written:1")  # round 1 logged, its checkpoint not swapped in
    assert checkpoint_round(run) is None
    done = resume_ok(run)
    assert "no checkpoint yet" in done.stderr
    assert_identical(reference, weights(run))


def test_kill_while_the_run_folder_is_created_leaves_no_folder(tmp_path):
    run = killed_at(tmp_path, "run-dir-created")
    assert not run.exists()  # so the same command simply runs again
    [left] = run.parent.glob(".killed.*.creating")  # the folder being created, whose creator died
    old = time.time() - STALE_SECONDS - 1
    os.utime(left, (old, old))
    assert hetfl("run", "--quiet", *flags(small_cfg(tmp_path / "runs", name="killed", rounds=1))).returncode == 0
    assert sorted(p.name for p in run.parent.iterdir()) == ["killed"]  # the next creation removed it


# ---- 6. the bench runner resumes from checkpoint.old --------------------------------------------------------
def test_bench_runner_resumes_a_run_left_as_checkpoint_old(tmp_path, monkeypatch):
    from hetfl.bench.runner import run_one

    cfg = small_cfg(tmp_path / "runs", name="bench-run", rounds=4, checkpoint_every=1)
    first = Simulation(cfg)
    first.run(progress=False, stop_after=2)
    os.replace(first.run_dir / "checkpoint", first.run_dir / "checkpoint.old")  # killed between the renames
    ran = []
    original = Simulation.run_round
    monkeypatch.setattr(Simulation, "run_round", lambda self, t: ran.append(t) or original(self, t))
    assert run_one(cfg, progress=False)["rounds"] == 4
    assert ran == [3, 4]  # resumed, not started again


def test_bench_runner_resumes_on_its_device_a_run_another_device_began(tmp_path, monkeypatch):
    """A run a GPU cut short comes back naming cuda; the runner goes on with it on the device asked now, never
    starting it again (the device is no part of the run)."""
    from hetfl.bench.runner import run_one

    cfg = small_cfg(tmp_path / "runs", name="gpu-run", rounds=4, checkpoint_every=1)
    first = Simulation(cfg)
    first.run(progress=False, stop_after=2)
    state = first.run_dir / "checkpoint" / "state.pt"
    payload = torch.load(state, weights_only=True)
    payload["config"]["device"] = "cuda"
    torch.save(payload, state)
    config = json.loads((first.run_dir / "config.json").read_text())
    (first.run_dir / "config.json").write_text(json.dumps({**config, "device": "cuda"}))
    ran = []
    original = Simulation.run_round
    monkeypatch.setattr(Simulation, "run_round", lambda self, t: ran.append(t) or original(self, t))
    assert run_one(cfg, progress=False)["rounds"] == 4
    assert ran == [3, 4]


# ---- 7. one writer per run folder --------------------------------------------------------------------------
def test_second_writer_of_a_live_run_is_refused_and_the_lock_dies_with_the_process(tmp_path):
    cfg = small_cfg(tmp_path / "runs", name="live", rounds=60, checkpoint_every=1)
    run = tmp_path / "runs" / "live"
    proc = start(cfg)
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.time() + TIMEOUT
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
        second = hetfl("run", "--resume", str(run), "--quiet")
        assert second.returncode == 2
        assert second.stderr.strip().count("\n") == 0 and "in use by another hetfl process" in second.stderr
        assert f"pid {proc.pid}" in second.stderr
        again = hetfl("run", "--quiet", *flags(cfg))
        assert again.returncode == 2 and "already exists" in again.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(TIMEOUT)
        proc.stderr.close()
    done = hetfl("run", "--resume", str(run), "--quiet", crash="round-logged:1")
    assert done.returncode == -signal.SIGKILL, done.stderr  # the OS dropped the lock: a new writer got to a round
