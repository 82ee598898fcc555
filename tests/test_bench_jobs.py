"""``hetfl bench jobs``: a shell command per run left, each training its run alone (``hetfl bench PRESET --run``),
then ``hetfl bench PRESET --reuse-saved`` writing the table without training; and the suite's GPU per worker.

The demo preset is listed, never trained: one round of its three runs takes minutes on this busy 2-core machine
(AllLarge's round alone 189 s), so the commands are run on a preset file of the same shape on digits.
"""

import json
import shlex
import threading
import time
from pathlib import Path

import pytest

from hetfl.bench.runner import FINISHED, _named_configs, load_preset, run_lock
from hetfl.cli import main

ROWS = """
title = "rows"
seeds = [0]
[base]
dataset = "digits"
num_clients = 10
model_width = 0.25
client_fraction = 0.3
rounds = 3
[[runs]]
label = "large"
method = "alllarge"
[[runs]]
label = "exclusive (d)"
method = "exclusivefl"
"""


def jobs(capsys, *args: str) -> tuple[str, str]:
    """(stdout, stderr) of a successful ``hetfl bench jobs`` call."""
    assert main(["bench", "jobs", *args]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def run_folders(runs: Path) -> list[str]:
    """The run folders under ``runs`` (not its .locks)."""
    return sorted(p.name for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")) if runs.exists() else []


def test_jobs_lists_a_command_per_run_of_the_demo_preset_and_writes_nothing(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    _, preset = load_preset("demo")
    pairs = [(entry["label"], seed) for entry in preset["runs"] for seed in preset["seeds"]]
    stdout, err = jobs(capsys, "demo", "--runs-dir", str(runs), "--out", str(out))
    lines = stdout.splitlines()
    assert len(lines) == len(pairs) == 3
    words = [shlex.split(line) for line in lines]
    assert all(w[:3] == ["hetfl", "bench", "demo"] and w[-1] == "--quiet" for w in words)
    assert [(w[w.index("--run") + 1], int(w[w.index("--seeds") + 1])) for w in words] == pairs
    assert all(w[w.index("--runs-dir") + 1] == str(runs.absolute()) for w in words)
    assert "'ExclusiveFL 25% (d)'" in stdout  # quoted for the shell
    assert len(err.splitlines()) == 1 and f"hetfl bench demo --out {out / 'demo'} --runs-dir {runs}" in err
    assert not runs.exists() and not out.exists()

    # more seeds, a horizon and a device this machine may lack: each line carries them
    stdout, _ = jobs(capsys, "demo", "--runs-dir", str(runs), "--seeds", "3,4", "--rounds", "2", "--device", "cuda:1")
    assert len(stdout.splitlines()) == 6
    assert all(line.endswith("--rounds 2 --device cuda:1 --quiet") for line in stdout.splitlines())
    assert "--seeds 4 " in stdout


def test_json_matches_the_lines(tmp_path, capsys):
    where = ["demo", "--runs-dir", str(tmp_path / "runs"), "--rounds", "1"]
    lines = jobs(capsys, *where)[0].splitlines()
    stdout, _ = jobs(capsys, *where, "--format", "json")
    assert len(stdout.splitlines()) == 1
    listed = json.loads(stdout)
    assert [job["command"] for job in listed] == lines
    assert all(set(job) == {"preset", "label", "seed", "run_dir", "command"} for job in listed)
    assert [(job["preset"], job["label"], job["seed"]) for job in listed] == \
        [("demo", label, 0) for label in ("AllSmall", "ExclusiveFL 25% (d)", "AllLarge")]
    configs = _named_configs(load_preset("demo")[1], {"rounds": 1}, None, (tmp_path / "runs").absolute())
    assert [job["run_dir"] for job in listed] == [str(Path(cfg.out) / cfg.name) for _, _, cfg in configs]


def test_the_lines_train_each_run_once_and_the_bench_then_writes_the_table_training_nothing(tmp_path, capsys,
                                                                                                monkeypatch):
    """The lines run one by one (the first while another process holds its run: it waits), then the table from
    the finished runs; a second ``bench jobs`` lists nothing, and a line run again reuses its run."""
    import hetfl.bench.runner as runner

    preset = tmp_path / "rows.toml"
    preset.write_text(ROWS)
    runs, out = tmp_path / "runs", tmp_path / "out"
    where = ["--runs-dir", str(runs), "--out", str(out), "--rounds", "1"]
    stdout, _ = jobs(capsys, str(preset), *where)
    lines = stdout.splitlines()
    assert len(lines) == 2  # 2 rows x 1 seed
    assert all(shlex.split(line)[2] == str(preset.absolute()) for line in lines)

    first = _named_configs(load_preset(str(preset))[1], {"rounds": 1}, None, runs.absolute())[0][2]
    codes: list[int] = []
    with run_lock(first, wait=True):  # another process is training the first line's run
        worker = threading.Thread(target=lambda: codes.append(main(shlex.split(lines[0])[1:])))
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive() and run_folders(runs) == []
    worker.join()
    assert codes == [0] and "another process is training it; waiting for it" in capsys.readouterr().out
    for line in lines[1:]:
        assert main(shlex.split(line)[1:]) == 0
    capsys.readouterr()
    trained = run_folders(runs)
    assert len(trained) == 2 and not out.exists()  # no table, nothing recorded in a results folder

    stdout, err = jobs(capsys, str(preset), *where)
    assert stdout == "" and len(err.splitlines()) == 1 and "no run left" in err

    def no_training(*args, **kwargs):
        raise AssertionError("a run was trained")

    monkeypatch.setattr(runner, "Simulation", no_training)
    assert main(shlex.split(lines[-1])[1:]) == 0  # finished: reused
    assert main(["bench", str(preset), "--reuse-saved", "--out", str(out / "rows"), "--runs-dir", str(runs),
                 "--rounds", "1", "--quiet"]) == 0
    capsys.readouterr()
    table = (out / "rows" / "table.md").read_text()
    assert "large" in table and "exclusive (d)" in table and "seeds [0]" in table
    assert run_folders(runs) == trained and not (out / "rows" / FINISHED).exists()

    # the table's runs count as done with --reuse-saved, on a machine without the runs folder
    fresh = ["--runs-dir", str(tmp_path / "fresh"), "--out", str(out), "--rounds", "1"]
    assert jobs(capsys, str(preset), *fresh, "--reuse-saved")[0] == ""
    assert len(jobs(capsys, str(preset), *fresh)[0].splitlines()) == 2


@pytest.mark.parametrize("command", [["jobs"], ["suite", "--plan", "--time-budget", "60"]])
def test_out_naming_a_presets_own_results_folder_is_refused(tmp_path, capsys, command):
    """``--out results/demo`` where ``results/demo`` holds demo's table: one folder too deep for jobs and suite,
    which would miss the table's saved runs and write results/demo/demo."""
    own = tmp_path / "demo"
    own.mkdir()
    (own / "table.md").write_text("# demo\n")
    assert main(["bench", command[0], "demo", *command[1:], "--out", str(own), "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--out {own} is the results folder of preset 'demo' itself" in err and f"--out {tmp_path}" in err, err
    assert sorted(p.name for p in own.iterdir()) == ["table.md"] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("args,fragment", [
    (["demo", "--run", "nope"], "bench demo --run: the preset has no run labelled 'nope'; its labels: 'AllSmall', "
                                "'ExclusiveFL 25% (d)', 'AllLarge'"),
    (["demo", "--run", "AllSmall", "--out", "OUT"], "writes no table: drop --out"),
    (["demo", "--run", "AllSmall", "--reuse-saved"], "writes no table: drop --reuse-saved"),
    (["speed", "--run", "AllSmall"], "--run names a run of a preset; 'speed' is a benchmark of its own"),
    (["demo", "--format", "json"], "--format is an option of hetfl bench jobs"),
    (["jobs"], "bench jobs: name at least one preset"),
    (["jobs", "demo", "--run", "AllSmall"], "bench jobs: --run not taken"),
    (["jobs", "demo", "--workers", "2"], "bench jobs: --workers not taken"),
    (["jobs", "demo", "--format", "csv"], "argument --format: invalid choice: 'csv'"),
    (["jobs", "demo", "--device", "tpu"], "device 'tpu' is not a torch device"),
    (["jobs", "demo", "speed"], "'speed' is a benchmark of its own"),
    (["suite", "demo", "--time-budget", "60", "--run", "AllSmall"], "--run is an option of hetfl bench PRESET"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, args, fragment):
    runs = tmp_path / "runs"
    argv = [str(tmp_path / a) if a == "OUT" else a for a in args]
    assert main(["bench", *argv, "--runs-dir", str(runs)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and captured.out == "", err
    assert not runs.exists() and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("device,worker,gpus,expected", [
    ("cuda", 0, 4, "cuda:0"), ("cuda", 3, 4, "cuda:3"), ("cuda", 5, 4, "cuda:1"), ("cuda", 2, 1, "cuda:0"),
    ("cuda:2", 5, 4, "cuda:2"), ("cpu", 1, 4, "cpu"), ("cuda", 1, 0, "cuda"),
])
def test_worker_device_spreads_plain_cuda_over_the_gpus(device, worker, gpus, expected):
    from hetfl.bench.suite import worker_device

    assert worker_device(device, worker, gpus) == expected


def test_a_suite_worker_trains_on_its_gpu(tmp_path, monkeypatch):
    """Worker 2 (the second) of a suite on plain cuda with 2 GPUs trains on cuda:1, on this machine too: the
    training is replaced by a record of the device asked for."""
    import hetfl.bench.suite as suite
    from hetfl.methods import config_from

    cfg = config_from(dict(dataset="digits", rounds=1, seed=0, out=str(tmp_path), name="r0", device="cuda"))
    job = suite.Job(cfg, labels=[("p", "row")])
    asked: list[str] = []
    monkeypatch.setattr(suite, "run_one", lambda c, progress: asked.append(c.device) or {"seed": 0})
    monkeypatch.setattr(suite, "_record_finished", lambda *args: None)
    suite._train_if_it_fits(job, [job], tmp_path, time.monotonic() + 600, {}, [], False, False, worker=2, gpus=2)
    assert asked == ["cuda:1"]


@pytest.mark.soak  # one round of the demo's three runs: minutes on 2 cores
def test_the_demo_presets_lines_run_one_by_one_then_its_table_from_them(tmp_path):
    import os
    import subprocess
    import sys

    def hetfl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hetfl", *args], capture_output=True, text=True, check=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    runs, out = tmp_path / "runs", tmp_path / "out"
    lines = hetfl("bench", "jobs", "demo", "--runs-dir", str(runs), "--out", str(out), "--rounds", "1").stdout
    lines = lines.splitlines()
    labels = [run["label"] for run in load_preset("demo")[1]["runs"]]
    assert len(lines) == len(labels)
    for line in lines:
        hetfl(*shlex.split(line)[1:])
    trained = run_folders(runs)
    hetfl("bench", "demo", "--reuse-saved", "--out", str(out / "demo"), "--runs-dir", str(runs), "--rounds", "1",
          "--quiet")
    table = (out / "demo" / "table.md").read_text()
    assert all(label in table for label in labels) and run_folders(runs) == trained
