"""``hetfl bench jobs PRESET [PRESET ...]`` and ``hetfl bench PRESET --run LABEL``: a sweep for a cluster scheduler.

``bench jobs`` prints one shell command per run left to train (a Slurm job array's task, a GNU parallel line, a
Kubernetes Job), and writes nothing. The runs left are those ``hetfl bench suite --plan`` would list
(``suite.load_suite``, ``suite._finished``, ``suite._saved``): a run two presets share is one command; a run
finished in the runs folder is done, and with ``--reuse-saved`` so is a run that a preset's results folder
(``OUT/PRESET``) holds in its summaries.json or finished-runs.json.

Each command is ``hetfl bench PRESET --run LABEL --seeds S --runs-dir DIR [--rounds N] [--device D] --quiet``:
it trains that one run into the shared runs folder under the run's lock (``runner.run_lock``, the lock every bench
process takes, so two jobs never train one run, twice or at once: the second waits, then reuses it), reusing it if
finished and resuming it if interrupted (``runner.run_one``), and writes no table. When they are done,
``hetfl bench PRESET --out OUT/PRESET --runs-dir DIR --reuse-saved`` writes the table from the finished runs,
training nothing. Paths in the commands are absolute: a scheduler may start a job in another folder.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import HetflError
from ..sim import device_named
from .runner import _named_configs, load_preset, run_lock, run_one
from .suite import PresetRuns, _finished, _saved, load_suite, suite_jobs


def missing_jobs(presets: list[str], out: str | None = None, runs_dir: str | None = None,
                 overrides: dict | None = None, seeds: list[int] | None = None,
                 reuse_saved: bool = False) -> tuple[list[dict], list[str]]:
    """(one job per run left to train, in the presets' order: {"preset", "label", "seed", "run_dir", "command"};
    the command that writes each preset's table once they are done). Reads the runs and results folders, writes
    nothing; HetflError for a bad preset, option or device name."""
    overrides = overrides or {}
    if "device" in overrides:
        device_named(overrides["device"])  # a name only: the jobs run on another machine
    runs_root = Path(runs_dir or Path("runs") / "bench").absolute()
    suite = load_suite(presets, out, runs_root, overrides, seeds, command="bench jobs")
    jobs = suite_jobs(suite)
    known = _finished(jobs, runs_root, _saved(suite, jobs) if reuse_saved else {})
    given = {p.name: p.given for p in suite}
    left = []
    for job in jobs:
        if job.cfg.name in known:
            continue
        preset, label = job.labels[0]  # a run presets share: the first one's row trains it for all of them
        left.append({"preset": preset, "label": label, "seed": job.cfg.seed, "run_dir": str(runs_root / job.cfg.name),
                     "command": run_command(given[preset], label, job.cfg.seed, runs_root, overrides)})
    return left, [table_command(p, runs_dir, seeds, overrides) for p in suite]


def run_command(preset: str, label: str, seed: int, runs_root: Path, overrides: dict) -> str:
    """The shell command that trains run ``label``, seed ``seed``, of ``preset`` (a name, or a .toml file: made
    absolute) alone into ``runs_root``, every word quoted for the shell."""
    if Path(preset).suffix == ".toml" and Path(preset).exists():
        preset = str(Path(preset).absolute())
    run = ["--run", label] if not label.startswith("-") else [f"--run={label}"]  # argparse reads -x as a flag
    flags = [word for key in ("rounds", "device") if key in overrides for word in (f"--{key}", str(overrides[key]))]
    return shlex.join(["hetfl", "bench", preset, *run, "--seeds", str(seed), "--runs-dir", str(runs_root), *flags,
                       "--quiet"])


def table_command(p: PresetRuns, runs_dir: str | None, seeds: list[int] | None, overrides: dict) -> str:
    """The shell command that writes preset ``p``'s table from its finished runs (no device: it trains nothing)."""
    flags = ["--out", str(p.out_dir), *(["--runs-dir", runs_dir] if runs_dir else []),
             *(["--seeds", ",".join(map(str, seeds))] if seeds else []),
             *(["--rounds", str(overrides["rounds"])] if "rounds" in overrides else [])]
    return shlex.join(["hetfl", "bench", p.given, *flags, "--reuse-saved"])


def run_label(name_or_path: str, label: str, runs_dir: str | None = None, overrides: dict | None = None,
              seeds: list[int] | None = None, progress: bool = True) -> list[dict]:
    """The summaries of preset run ``label``'s runs, one per seed (``seeds``, default the preset's), each trained
    into the runs folder, resumed or reused under its lock; writes no table. HetflError naming the preset's labels
    when it has no run ``label``."""
    name, preset = load_preset(name_or_path)
    runs_root = Path(runs_dir or Path("runs") / "bench")
    configs = _named_configs(preset, overrides or {}, seeds, runs_root)
    labels = list(dict.fromkeys(lab for lab, _, _ in configs))
    if label not in labels:
        raise HetflError(f"bench {name_or_path} --run: the preset has no run labelled {label!r}; its labels: "
                         f"{', '.join(map(repr, labels))}")
    summaries = []
    for lab, seed, cfg in configs:
        if lab == label:
            where = f"[bench {name} --run] {label}, seed {seed}"
            print(f"{where}: {runs_root / cfg.name}", flush=True)
            summaries.append(_train_locked(cfg, progress, where))
            accuracy = summaries[-1].get("accuracy")
            print(f"{where}: finished" + (f", accuracy {100 * accuracy:.2f}%" if accuracy is not None else ""),
                  flush=True)
    return summaries


def _train_locked(cfg, progress: bool, where: str) -> dict:
    """The summary of ``cfg``'s run, trained, resumed or reused under its lock; a run another process is training
    is waited for, then reused from its folder."""
    with run_lock(cfg, wait=False) as mine:
        if mine:
            return run_one(cfg, progress)
    print(f"{where}: another process is training it; waiting for it", flush=True)
    with run_lock(cfg, wait=True):
        return run_one(cfg, progress)
