"""scripts/remote-gpu/: the runs a remote machine's time budget cut short come back from their checkpoints and go
on here (partial_runs.py); remote.sh says how it is used."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetfl.bench.runner import config_key, run_lock
from hetfl.methods import config_from
from hetfl.sim import Simulation
from weights import assert_identical

REMOTE_GPU = Path(__file__).resolve().parent.parent / "scripts" / "remote-gpu"
sys.path.insert(0, str(REMOTE_GPU))
import partial_runs  # noqa: E402


def bench_cfg(out: Path, seed: int):
    """A tiny FedAvg run named and placed as `hetfl bench` names its runs (METHOD-KEY-sSEED: the bench lock's key)."""
    cfg = config_from(dict(method="alllarge", dataset="digits", model_width=0.25, num_clients=20, client_fraction=0.25,
                           rounds=3, batch_size=16, lr=0.05, checkpoint_every=1, seed=seed, out=str(out)))
    return cfg.replace(name=f"{cfg.method}-{config_key(cfg)}-s{seed}")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Three runs, made once: two rounds of three (a), finished (b), one round of three (c); and a whole run of a."""
    root = tmp_path_factory.mktemp("made")
    cfgs = [bench_cfg(root / "runs", seed) for seed in (0, 1, 2)]
    Simulation(cfgs[0]).run(progress=False, stop_after=2)
    Simulation(cfgs[1]).run(progress=False)
    Simulation(cfgs[2]).run(progress=False, stop_after=1)
    whole = Simulation(cfgs[0].replace(out=str(root / "whole"))).run(progress=False)
    return root / "runs", cfgs, Path(whole["run_dir"]) / "final_model.pt"


def copied(made, there: Path):
    """The made runs, copied to ``there``."""
    shutil.copytree(made[0], there)
    return [cfg.replace(out=str(there)) for cfg in made[1]]


def test_pack_brings_back_the_runs_cut_short_in_parts_within_the_limits(made, tmp_path):
    a, _, c = copied(made, tmp_path / "there")
    out = tmp_path / "out"
    out.mkdir()
    (out / "suite.log").write_text("x" * 1000)
    sizes = [partial_runs.size(Path(cfg.out) / cfg.name) for cfg in (a, c)]
    part = max(sizes) // 2  # each run needs several parts
    names = partial_runs.pack(tmp_path / "there", out, max_file=part, max_total=10 * part, margin=0)
    assert sorted(names) == sorted([a.name, c.name])  # the finished run stays: its summary came back already
    parts = sorted(out.glob("partial-runs.tar.*"))
    assert len(parts) >= 3 and all(p.stat().st_size <= part for p in parts)
    assert len(parts) + 1 <= 8 and sum(p.stat().st_size for p in out.iterdir()) <= 10 * part

    for p in parts:  # room for one run only: the one whose checkpoint saved the most seconds per byte
        p.unlink()
    room = max(sizes) + part
    assert partial_runs.pack(tmp_path / "there", out, max_file=room, max_total=room + 1000, margin=0) == [a.name]
    assert partial_runs.pack(tmp_path / "there", out, skip=frozenset({a.name})) == [c.name]  # a committed table's
    assert len(list(out.glob("partial-runs.tar.*"))) == 1  # an earlier pack's parts are replaced


def test_the_way_back_leaves_out_the_runs_that_did_not_move(made, tmp_path):
    """Runs begun here go to the remote machine (stage); what comes back are the ones it moved on."""
    a, _, c = copied(made, tmp_path / "cpu")
    staged, back, there = tmp_path / "staged", tmp_path / "back", tmp_path / "there"
    staged.mkdir(), back.mkdir()
    assert sorted(partial_runs.pack(tmp_path / "cpu", staged)) == sorted([a.name, c.name])
    assert len(partial_runs.unpack(staged, there)) == 2
    assert partial_runs.pack(there, back, skip_unmoved=True) == []
    Simulation.resume(there / c.name, device="cpu").run(progress=False, stop_after=2)
    assert partial_runs.pack(there, back, skip_unmoved=True) == [c.name]


def test_unpack_resumes_here_and_never_replaces_a_run_further_along_or_busy(made, tmp_path):
    a, b, c = copied(made, tmp_path / "there")
    out, here = tmp_path / "out", tmp_path / "here"
    out.mkdir()
    assert len(partial_runs.pack(tmp_path / "there", out)) == 2

    c_here = c.replace(out=str(here))
    Simulation(c_here).run(progress=False, stop_after=2)  # here, c is a round further than the remote copy
    said = partial_runs.unpack(out, here)
    assert said == [f"{a.name}: checkpoint of round 2 in place; a suite resumes it",
                    f"{c.name}: here at round 2, the remote copy's at 1; kept"]
    resumed = Simulation.resume(here / a.name, device="cpu")
    assert resumed.start_round == 2
    assert_identical(torch.load(made[2], weights_only=True),
                     torch.load(Path(resumed.run(progress=False)["run_dir"]) / "final_model.pt", weights_only=True))

    said = partial_runs.unpack(out, here)  # again: a is finished here now
    assert said[0] == f"{a.name}: finished here already; kept"
    (here / c.name / "checkpoint").rename(here / c.name / "gone")  # here, c has no checkpoint: the remote copy goes on
    with run_lock(c_here, wait=False) as mine:  # ... unless a process here trains it
        assert mine
        assert partial_runs.unpack(out, here)[1] == f"{c.name}: a process here is training it; kept"
    assert partial_runs.unpack(out, here)[1] == f"{c.name}: checkpoint of round 1 in place; a suite resumes it"
    assert partial_runs.checkpoint_round(here / c.name) == 1
    assert not [p for p in here.iterdir() if p.name.startswith(".unpacking-")]  # the unpacked copies are cleaned up


def test_the_script_without_a_verb_prints_its_usage():
    done = subprocess.run(["bash", str(REMOTE_GPU / "remote.sh")], capture_output=True, text=True)
    assert done.returncode == 2
    assert all(f"remote.sh {verb}" in done.stdout for verb in ("stage", "stage-text", "run", "collect"))
