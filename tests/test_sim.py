"""The simulator end to end on real data: learning, determinism, resume, participation rules."""

import json

import pytest
import torch
from weights import assert_identical

from hetfl.machine import device_seconds
from hetfl.sim import Simulation


def final_weights(summary):
    return torch.load(f"{summary['run_dir']}/final_model.pt", weights_only=True)


def test_alllarge_learns_digits_well_above_chance(tiny_cfg):
    summary = Simulation(tiny_cfg(rounds=8, client_fraction=0.5, model_width=0.5)).run(progress=False)
    assert summary["accuracy"] > 0.6  # 10 classes: chance is 0.1
    assert summary["rounds_to_target"] is None  # no target set
    assert set(summary["final"]["global"]) == {"exit1", "exit2", "exit3", "exit4", "ensemble", "loss"}


def test_run_folder_contents(tiny_cfg):
    summary = Simulation(tiny_cfg(name="r1", eval_every=2)).run(progress=False)
    run = tiny_cfg().out + "/r1"
    assert summary["run_dir"] == run
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    assert [r["round"] for r in records] == [1, 2, 3]
    # a round's seconds hold its evaluation's, measured apart: rounds 2 (every 2nd) and 3 (the last) evaluate
    assert [bool(r["eval"]) for r in records] == [r["eval_seconds"] > 0 for r in records] == [False, True, True]
    assert all(r["eval_seconds"] < r["seconds"] for r in records)
    assert json.load(open(f"{run}/config.json"))["dataset"] == "digits"
    assert json.load(open(f"{run}/summary.json"))["rounds"] == 3
    assert summary["bytes_down_per_round"] > 0


@pytest.mark.parametrize("server_opt", ["fedavg", "feddyn"])
def test_same_seed_gives_bit_identical_weights(tiny_cfg, server_opt):
    a = Simulation(tiny_cfg(server_opt=server_opt)).run(progress=False)
    b = Simulation(tiny_cfg(server_opt=server_opt)).run(progress=False)
    assert_identical(final_weights(a), final_weights(b))
    c = Simulation(tiny_cfg(server_opt=server_opt, seed=1)).run(progress=False)
    assert not torch.equal(final_weights(a)["blocks.0.0.weight"], final_weights(c)["blocks.0.0.weight"])


@pytest.mark.parametrize("server_opt,checkpoint_every,killed_after", [
    ("fedavg", 1, 2),   # killed right after a checkpoint
    ("feddyn", 2, 3),   # killed one round past the checkpoint, with per-client state on disk
    ("fedadam", 2, 3),  # server optimizer state
])
def test_resume_gives_bit_identical_weights(tiny_cfg, server_opt, checkpoint_every, killed_after):
    cfg = tiny_cfg(rounds=4, server_opt=server_opt, checkpoint_every=checkpoint_every,
                   server_lr=0.01 if server_opt == "fedadam" else 1.0, scenario="dynamic", method="decoupled")
    whole = Simulation(cfg.replace(name="whole")).run(progress=False)
    interrupted = Simulation(cfg.replace(name="cut"))
    interrupted.run(progress=False, stop_after=killed_after)
    resumed = Simulation.resume(interrupted.run_dir)
    assert resumed.start_round == killed_after - (killed_after % checkpoint_every)
    summary = resumed.run(progress=False)
    assert_identical(final_weights(whole), final_weights(summary))
    rounds = [json.loads(l)["round"] for l in open(f"{summary['run_dir']}/metrics.jsonl")]
    assert rounds == [1, 2, 3, 4]
    # each stretch of rounds names the hardware that computed it: the resumed run has two
    assert [seg["from_round"] for seg in whole["segments"]] == [1]
    assert [seg["from_round"] for seg in summary["segments"]] == [1, resumed.start_round + 1]
    assert json.load(open(f"{summary['run_dir']}/summary.json"))["segments"] == summary["segments"]
    assert {"device", "torch", "cpu", "cpu_capability", "threads"} <= set(summary["segments"][0])
    # ... and the wall seconds before it, so that a run's time splits by device (machine.device_seconds)
    before = [seg["elapsed_before"] for seg in summary["segments"]]
    assert before[0] == 0.0 < before[1] < summary["wall_seconds"]
    assert device_seconds(summary) == {"cpu": pytest.approx(summary["wall_seconds"])}


def test_exclusivefl_trains_only_clients_that_afford_the_global_level(tiny_cfg):
    sim = Simulation(tiny_cfg(method="exclusivefl", global_level=3, client_fraction=1.0))
    before = {k: v.clone() for k, v in sim.global_state.items()}
    log = sim.run_round(1)
    assert log.clients == sum(sim.scenario.levels(1) >= 3)  # levels 3 and 4: half of 20 clients
    assert log.clients == 10
    changed = {k for k in before if not torch.equal(before[k], sim.global_state[k])}
    assert changed and all(k.startswith(("blocks.0", "blocks.1", "blocks.2", "exits.0", "exits.1", "exits.2"))
                           for k in changed)


def test_allsmall_moves_only_the_smallest_model(tiny_cfg):
    sim = Simulation(tiny_cfg(method="allsmall"))
    before = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round(1)
    changed = {k for k in before if not torch.equal(before[k], sim.global_state[k])}
    assert changed == {k for k in before if k.startswith(("blocks.0.", "exits.0."))}


def test_decoupled_levels_are_trained_only_by_their_own_clients(tiny_cfg):
    sim = Simulation(tiny_cfg(method="decoupled", client_fraction=0.2))
    before = {k: v.clone() for k, v in sim.global_state.items()}
    sampled_levels = {int(sim.scenario.levels(1)[c]) for c in sim.sample_clients(1)}
    sim.run_round(1)
    for level in range(1, 5):
        moved = any(not torch.equal(before[k], sim.global_state[k]) for k in before if k.startswith(f"level{level}/"))
        assert moved == (level in sampled_levels)
    assert set(sim.evaluate()[0]) == {"global", "level1", "level2", "level3"}


@pytest.mark.soak  # a real process killed and resumed: about 30 s
def test_run_killed_by_a_signal_resumes_to_bit_identical_weights(tiny_cfg, tmp_path):
    """A real `hetfl run` process is SIGKILLed mid-run, then `hetfl run --resume` finishes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tiny_cfg(rounds=8, checkpoint_every=2, server_opt="feddyn")

    def command(name):
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.replace(name=name).to_dict().items()
                 if isinstance(v, (int, float, str)) and not isinstance(v, bool) and v != ""]
        return [sys.executable, "-m", "hetfl", "run", "--quiet", *flags]

    # both runs in processes with the same thread count: CPU kernels may sum in another order on more threads
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = subprocess.run(command("whole"), env=env, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen(command("killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < 8
    resumed = subprocess.run([sys.executable, "-m", "hetfl", "run", "--resume", str(metrics.parent), "--quiet"],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "exit4" in resumed.stdout
    assert_identical(torch.load(tmp_path / "runs" / "whole" / "final_model.pt", weights_only=True),
                     torch.load(metrics.parent / "final_model.pt", weights_only=True))


def test_rounds_to_target_is_the_first_round_reaching_it(tiny_cfg):
    summary = Simulation(tiny_cfg(rounds=4, client_fraction=0.5, target_accuracy=0.3)).run(progress=False)
    first = next(t for t, a in summary["curve"] if a >= 0.3)
    assert summary["rounds_to_target"] == first
