"""``hetfl bench suite PRESET [PRESET ...]``: spend a limited time on a device on the runs of several presets.

An accelerator is often there for a fixed time only (a cluster job's time limit, a spot instance, a GPU rented
for 15 minutes). The suite starts ``--workers`` processes that go through the runs of every named preset in order and
claim each through the run's lock (``runner.run_lock``, the lock ``hetfl bench`` processes share), so no run is
trained twice, by them or by any other bench process on the same runs folder. A run is trained, resumed from its
checkpoint or reused exactly as ``hetfl bench`` would (``runner.run_one``), and its summary is added at once to the
``finished-runs.json`` of every preset holding it, so a later call (or ``--reuse-saved`` on another machine) goes
on from there.

**Which runs start.** A run starts only if ``ESTIMATE_MARGIN x its estimate + START_SECONDS`` fits in the
time left before the stop (``estimate``: the seconds it still needs):

1. a run that has logged ``OWN_PACE_ROUNDS`` rounds or more on this device type (a run a GPU began and this
   machine goes on with has logged rounds of both; its checkpoint's segments say which): their median ``seconds``
   (a round that held a pause, a stopped worker or a sleeping laptop, would swing a mean: one 1,433 s round in
   17 of about 10 s made a run of 150 rounds look like 4 hours) x the rounds after its last checkpoint;
2. else the mean seconds per round of the other runs of the same preset and label (other seeds) on the same
   device type: the finished ones' rounds there (``machine.device_split``), the unfinished ones' own pace where
   it counts by rule 1, and the runs of that label its results folder holds at the preset's own horizon (a call
   with ``--rounds``: what a table would cost run longer, from the table as it is); x the rounds after its last
   checkpoint;
3. else the same over the suite's runs that do the same work per round (another row or preset): the same
   config but for what leaves a round's work as it is (``ROUND_NEUTRAL``: the seed, the horizon, the step size
   and its schedule, how the data are split, where the run is written). Never another method's pace, nor
   another recipe's: FedDF's server distillation makes its round many times a FedAvg round on the same model
   (borrowed from its preset's other rows, FedDF's runs of ``scalefl-table3`` were estimated at 750 s on this
   CPU, where they take hours), and DepthFL's exclusive rows (FedDyn and the mutual KD) take 1-2x the FedAvg
   exclusive rows' time on this CPU and about 5x on a shared H100;
4. else its own few logged rounds, as in 1;
5. else nothing is known: it starts if ``START_SECONDS`` are left (the stop below bounds what it costs).

**In which order** (``--order``). ``shortest`` (the default): the runs by their estimates, shortest first, those
without one last, ties in the presets' order. With a common stop and workers of one speed, shortest first
finishes the most runs the budget holds (a longer run in its place can only finish later). ``given``: the
presets' order, run by run, when a table must be finished before the next one starts. ``claims``: the runs of
the claim that needs the fewest estimated seconds to be decided first, then of the next (``claims_first``): the
most claims decided soonest, where shortest first finishes the most runs (a claim waits for every seed of each
row it compares, its slowest included).

``--plan`` trains nothing: it prints, for every run left, its estimate, which rule gave it, and what the
workers would do with it within the budget if every estimate held (``plan``), on any machine: a time-limited job's
plan is made before the job, from the summaries its earlier jobs left.

A run's first rounds say little of its pace (a moment of contention, round 1's first kernels): two rounds of
a ReeFL run timed at 94 s each under contention once put its estimate at five times its siblings' pace, and it
waited behind every other run.

A run that cannot finish in the time left still starts, after the runs that can, if it can reach its next
checkpoint (after round 1, every ``checkpoint_every`` rounds, after the last): its work up to there is kept,
so a run longer than any budget advances from call to call. That holds only where the next call finds the runs
folder: a job whose runs folder goes with it (a new checkout, a spot instance's disk) loses a run cut short whole.
``--whole-runs`` (``whole``) starts only the runs whose estimate fits whole, none without an estimate: the end of
such a job's budget goes to shorter runs that finish rather than to the start of a long one.

**How it stops.** Workers are sent SIGTERM ``stop_margin(budget)`` seconds before the budget ends and
SIGKILL ``TERM_GRACE`` seconds later, so no worker holds the device when the budget ends. A worker whose suite
process is gone (killed, even by SIGKILL) stops itself at once, as at SIGTERM: it watches its parent. A
stopped run keeps its last checkpoint (run folders survive ``kill -9``) and its lock goes with its process.

**A run that fails.** A run that raises an error hetfl did not foresee (a bug, a device that fails) is
recorded as failed for this call and ends its worker, whose process may be unsound (a CUDA context after a
device-side error); the suite starts a worker in its place, and no worker takes a failed run again in this call:
one bad run costs one attempt, not every worker (the next call tries it again). Its traceback is in the log, and
the call ends with exit code 1 and the failed runs' names.

Then each preset whose runs are all finished gets its table, as ``hetfl bench PRESET`` writes it (every run
taken from ``finished-runs.json``: nothing is trained after the budget); the others say how many runs they lack.
A table whose ``summaries.json`` already holds every run asked for is left as it is: rewritten, it would only
trade its regenerate line for this call's options (a committed table named beside a new preset, say).

**On several GPUs.** With ``--device cuda`` worker i (from 0) trains on ``cuda:{i mod the GPUs visible}``
(``worker_device``), so the workers share every GPU of the machine; ``--device cuda:N`` keeps them all on N.

**What counts as finished.** A run whose folder under the runs folder holds its summary; with ``--reuse-saved``
also a run that a preset's results folder already holds (its ``summaries.json`` or ``finished-runs.json``, by
run folder name, as ``hetfl bench PRESET --reuse-saved`` takes them). A job on a fresh machine then trains
only the rows a committed table lacks (``--out docs/results --reuse-saved``), never its finished runs again.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from statistics import mean, median

from ..config import Config
from ..errors import HetflError
from ..machine import device_split, device_type, threads_each
from ..report import claim_labels
from ..rundir import read_jsonl
from .runner import (FINISHED, _named_configs, _record_finished, _saved_by_run_name, at_target, finished_run,
                     load_preset, run_bench, run_lock, run_one, saved_runs)

ESTIMATE_MARGIN = 1.2  # estimates come from other seeds, other loads, other thread counts
OWN_PACE_ROUNDS = 5  # a run's own rounds estimate its pace from this many on (the module's docstring, rule 1)
START_SECONDS = 5.0  # a run's set-up outside its timed rounds: data, model, first kernels
TERM_GRACE = 2.0  # seconds from SIGTERM to SIGKILL
# Config fields that leave the work of a round as it is (rule 3 of the module's docstring): the step size and its
# schedule, the seed and the data's split (the sampled clients hold as many samples on average), the horizon, and
# where and how often the run is written
ROUND_NEUTRAL = frozenset({"seed", "rounds", "lr", "lr_schedule", "lr_steps", "lr_gamma", "lr_min", "momentum",
                           "weight_decay", "clip_grad", "clip_value", "partition", "alpha", "classes_per_client",
                           "min_client_size", "target_accuracy", "checkpoint_every", "checkpoint_seconds",
                           "round_timeout", "out", "name", "device", "data_dir"})
# benchmarks of their own
NOT_PRESETS = ("speed", "memory", "checkpoint", "chaos", "flower", "throughput", "scaling", "suite", "jobs")


def stop_margin(budget: float) -> float:
    """Seconds before the end of ``budget`` at which workers are sent SIGTERM (SIGKILL follows TERM_GRACE later)."""
    return min(TERM_GRACE + 1.0, budget / 4)


@dataclass
class PresetRuns:
    """One preset of the suite: its name, how it was given, its results folder and its (label, seed, config)s."""

    name: str
    given: str
    out_dir: Path
    configs: list[tuple[str, int, Config]]
    # the runs its results folder holds at the preset's own horizon, by label: with ``--rounds``, the pace of the
    # table as it is (rule 2 of the module's docstring)
    saved: dict[str, dict[str, dict]] = field(default_factory=dict)  # label -> run folder name -> summary
    claims: list[dict] = field(default_factory=list)  # its claims


@dataclass
class Job:
    """One run to train, once, however many presets hold it."""

    cfg: Config  # writes to its run folder under the runs folder
    labels: list[tuple[str, str]] = field(default_factory=list)  # (preset, label) of each preset holding it
    finished_files: list[Path] = field(default_factory=list)  # their FINISHED files
    # the summaries of its labels' runs that their results folders hold and the suite does not run: the same rows
    # at another horizon (``--rounds``) or of seeds not asked for (rule 2 of the module's docstring)
    saved_elsewhere: dict[str, dict] = field(default_factory=dict)  # run folder name -> summary


def load_suite(presets: list[str], out: str | None, runs_root: Path, overrides: dict,
               seeds: list[int] | None, command: str = "bench suite") -> list[PresetRuns]:
    """The named presets with their validated configs; raises HetflError (its message begins with ``command``)
    before anything is written."""
    if not presets:
        example = "--time-budget 600" if command == "bench suite" else ""
        raise HetflError(f"{command}: name at least one preset, e.g. hetfl {command} demo {example}")
    suite: list[PresetRuns] = []
    for given in presets:
        if given in NOT_PRESETS:
            raise HetflError(f"{command} takes presets; '{given}' is a benchmark of its own: hetfl bench {given}")
        name, preset = load_preset(given)
        out_dir = Path(out) / name if out else Path("results") / name
        if out and Path(out).name == name and not out_dir.exists() and _holds_results(Path(out)):
            # --out one level too deep would write a nested copy and miss the runs the table already holds
            raise HetflError(f"{command}: --out {out} is the results folder of preset '{name}' itself; {command} "
                             f"takes the folder that holds each preset's folder: --out {Path(out).parent}")
        if any(p.out_dir == out_dir for p in suite):
            raise HetflError(f"{command}: preset '{name}' is named twice (its results go to {out_dir}); name it once")
        suite.append(PresetRuns(name, given, out_dir, _named_configs(preset, overrides, seeds, runs_root),
                                _saved_by_label(preset, overrides, out_dir, runs_root), preset.get("claims", [])))
    return suite


def _holds_results(folder: Path) -> bool:
    """Whether ``folder`` is a bench's results folder (what ``hetfl bench PRESET --out`` writes)."""
    return any((folder / f).exists() for f in ("table.md", "summaries.json", FINISHED))


def _saved_by_label(preset: dict, overrides: dict, out_dir: Path, runs_root: Path) -> dict[str, dict[str, dict]]:
    """The runs ``out_dir`` holds (its summaries.json and ``FINISHED``) of the preset's rows at the preset's own
    horizon, every seed they hold, by label and run folder name."""
    saved = saved_runs(out_dir)
    if not saved:
        return {}
    seeds = sorted({*preset.get("seeds", [0]), *(s["seed"] for s in saved.values() if isinstance(s.get("seed"), int))})
    own = {k: v for k, v in overrides.items() if k != "rounds"}
    by_label: dict[str, dict[str, dict]] = {}
    for label, _, cfg in _named_configs(preset, own, seeds, runs_root):
        if (summary := saved.get(cfg.name)) is not None:
            by_label.setdefault(label, {})[cfg.name] = summary
    return by_label


def suite_jobs(suite: list[PresetRuns]) -> list[Job]:
    """The suite's runs in preset order, each once (a run two presets share is one job)."""
    jobs: dict[str, Job] = {}
    for p in suite:
        for label, _, cfg in p.configs:
            job = jobs.setdefault(cfg.name, Job(cfg))
            job.labels.append((p.name, label))
            job.finished_files.append(p.out_dir / FINISHED)
    for p in suite:
        for label, _, cfg in p.configs:
            job = jobs[cfg.name]
            job.saved_elsewhere.update((name, s) for name, s in p.saved.get(label, {}).items() if name not in jobs)
    return list(jobs.values())


def claim_runs(suite: list[PresetRuns]) -> list[frozenset[str]]:
    """The runs (by run folder name) each claim of the suite's presets compares: every seed of every row it names."""
    return [frozenset(cfg.name for label, _, cfg in p.configs if label in labels)
            for p in suite for labels in map(claim_labels, p.claims) if labels]


def checkpoint_of(run_dir: Path) -> tuple[int, list[dict]]:
    """The round of the run folder's last checkpoint and its segments, ``Simulation.segments`` ((0, []) if none or
    unreadable)."""
    import torch

    for folder in ("checkpoint", "checkpoint.old"):  # .old: a kill between a checkpoint's two renames
        path = run_dir / folder / "state.pt"
        if path.exists():
            try:  # mmap: the round, without reading the model's tensors
                payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                return int(payload["round"]), list(payload.get("segments", []))
            except Exception:  # being swapped by its writer, or damaged: resume will tell
                return 0, []
    return 0, []


def _checkpoint_round(run_dir: Path) -> int:
    return checkpoint_of(run_dir)[0]


def estimate(job: Job, jobs: list[Job], finished: dict[str, dict]) -> float | None:
    """Seconds ``job``'s run still needs, by the rule of the module's docstring; None when nothing is known.
    ``finished``: the summaries of the finished runs, by run folder name."""
    return estimate_and_source(job, jobs, finished)[0]


def estimate_and_source(job: Job, jobs: list[Job], finished: dict[str, dict]) -> tuple[float | None, str]:
    """``estimate`` and which rule gave it, in words."""
    cfg, device = job.cfg, device_type(job.cfg.device)
    done, logged = _progress(cfg, device)
    left = max(cfg.rounds - done, 0)
    if len(logged) >= OWN_PACE_ROUNDS:
        return median(logged) * left, f"its own {len(logged)} rounds"
    paces_of: dict[str, float | None] = {}  # a run both rules relate is read once

    def pace_of(other: Job) -> float | None:
        """Seconds per round of ``other`` on this device type: a finished run's rounds there, an unfinished one's
        own pace where it counts by rule 1, else None."""
        if other.cfg.name not in paces_of:
            pace = None
            if (summary := finished.get(other.cfg.name)) is not None:
                seconds, rounds = device_split(summary).get(device, (0.0, 0))
                pace = seconds / rounds if rounds else None
            elif len(theirs := _progress(other.cfg, device)[1]) >= OWN_PACE_ROUNDS:
                pace = median(theirs)
            paces_of[other.cfg.name] = pace
        return paces_of[other.cfg.name]

    work = round_work(cfg)
    saved = [seconds / rounds for seconds, rounds in (device_split(s).get(device, (0.0, 0))
                                                      for s in job.saved_elsewhere.values()) if rounds]
    for whose, related, also in (("its label's runs", lambda other: set(other.labels) & set(job.labels), saved),
                                 ("runs of the same work per round", lambda other: round_work(other.cfg) == work,
                                  [])):
        paces = [pace for other in jobs if other is not job and related(other)
                 and (pace := pace_of(other)) is not None] + also
        if paces:
            return mean(paces) * left, f"{whose} on {device}"
    return (median(logged) * left, f"its own {len(logged)} rounds") if logged else (None, "nothing known")


def round_work(cfg: Config) -> dict:
    """What a round of ``cfg``'s run computes: its config but for ``ROUND_NEUTRAL`` (rule 3)."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ROUND_NEUTRAL}


def _progress(cfg: Config, device: str) -> tuple[int, list[float]]:
    """The round of the run's last checkpoint and the seconds of its logged rounds computed on ``device``'s type
    (a run a GPU began and this machine goes on with has logged rounds of both: its checkpoint's segments say
    which, older ones the device its config.json names)."""
    run_dir = Path(cfg.out) / cfg.name
    done, segments = checkpoint_of(run_dir)
    began_on = _folder_device(run_dir)

    def here(round_index: int) -> bool:  # computed on this device type: its segment's (older ones: where it began)
        began = [s for s in segments if s.get("from_round", 1) <= round_index]
        return device_type(began[-1].get("device", began_on) if began else began_on) == device

    try:  # a run begun on another device goes on here: only the rounds timed on this device type count
        logged = [r["seconds"] for r in read_jsonl(run_dir / "metrics.jsonl")[0] if r.get("seconds")
                  and here(r["round"])]
    except HetflError:  # a corrupt log: resume will say so
        logged = []
    return done, logged


def _folder_device(run_dir: Path) -> str:
    """The device the run folder's config.json names (where the run began; cpu when unreadable)."""
    try:
        return str(json.loads((run_dir / "config.json").read_text()).get("device", "cpu"))
    except (OSError, ValueError, AttributeError):
        return "cpu"


def to_next_checkpoint(cfg: Config, runs_root: Path) -> int:
    """Rounds from the run's last checkpoint to its next one (after round 1, every ``checkpoint_every`` rounds and
    after the last: ``Simulation.checkpoint_due``'s rule, its clock left out)."""
    done = _checkpoint_round(runs_root / cfg.name)
    every = (done // cfg.checkpoint_every + 1) * cfg.checkpoint_every
    return min(r for r in (1, every, cfg.rounds) if r > done) - done if done < cfg.rounds else 0


def to_checkpoint(job: Job, need: float | None, runs_root: Path) -> float | None:
    """Seconds ``job``'s run needs to reach its next checkpoint, from ``need`` (what it needs to finish; None:
    unknown)."""
    cfg = job.cfg
    left = cfg.rounds - _checkpoint_round(runs_root / cfg.name)
    return None if need is None else need * to_next_checkpoint(cfg, runs_root) / max(left, 1)


def fits(seconds: float | None, left: float) -> bool:
    """Whether a run estimated at ``seconds`` (None: unknown) may start with ``left`` seconds to the stop."""
    return ESTIMATE_MARGIN * (seconds or 0.0) + START_SECONDS <= left


@dataclass
class Planned:
    """What the suite would do with one run left if every estimate held (``plan``)."""

    job: Job
    need: float | None  # its estimate (None: unknown)
    source: str  # which rule gave it
    start: float | None = None  # seconds into the budget; None: not started
    end: float | None = None  # when it finishes; None: cut short at the stop (its checkpoints kept) or not started


def may_start(p: Planned, runs_root: Path, left: float, whole: bool = False) -> bool:
    """Whether ``p``'s run fits in ``left`` seconds whole, or (unless ``whole``) up to its next checkpoint; under
    ``whole`` a run without an estimate does not start."""
    if whole:
        return p.need is not None and fits(p.need, left)
    return fits(p.need, left) or fits(to_checkpoint(p.job, p.need, runs_root), left)


ORDERS = ("shortest", "given", "claims")  # --order: the module's docstring, "In which order"


def in_order(planned: list[Planned], order: str, claims: list[frozenset[str]] = ()) -> list[Planned]:
    """``planned`` in the suite's ``order``: ``shortest``, by estimate with the unknown last (a stable sort: ties
    keep the presets' order), ``given``, as they are, or ``claims`` (``claims_first`` of ``claims``, the runs each
    claim compares)."""
    if order not in ORDERS:
        raise HetflError(f"bench suite: --order must be one of {', '.join(ORDERS)}, not '{order}'")
    if order == "given":
        return list(planned)
    shortest = sorted(planned, key=lambda p: (p.need is None, p.need or 0.0))
    return claims_first(shortest, claims) if order == "claims" else shortest


def claims_first(shortest: list[Planned], claims: list[frozenset[str]]) -> list[Planned]:
    """The runs left (``shortest``: shortest first) so that claims are decided soonest: the runs of the claim whose
    runs left need the fewest estimated seconds (one without an estimate: after every claim with them all; ties:
    the presets' claim order), shortest first; then those of the cheapest claim given the runs already placed, and
    so on; last the runs no claim compares, shortest first. A claim decides only when every seed of every row it
    compares has run (``report.check_claim``), so its cost is the sum of them all, and runs two claims share count
    once: greedy, as choosing the order that decides the most claims by a deadline is a knapsack."""
    need = {p.job.cfg.name: p.need for p in shortest}
    placed: set[str] = set()
    ordered: list[Planned] = []
    while pending := [runs for claim in claims if (runs := (claim & need.keys()) - placed)]:
        cheapest = min(pending, key=lambda runs: (any(need[r] is None for r in runs), sum(need[r] or 0.0
                                                                                          for r in runs)))
        ordered += [p for p in shortest if p.job.cfg.name in cheapest]
        placed |= cheapest
    return ordered + [p for p in shortest if p.job.cfg.name not in placed]


def plan(jobs: list[Job], known: dict[str, dict], runs_root: Path, budget: float, workers: int,
         order: str = "shortest", whole: bool = False, claims: list[frozenset[str]] = ()) -> list[Planned]:
    """The runs left, in the suite's ``order`` (``claims``: ``in_order``'s), with what ``workers`` workers would do
    in ``budget`` seconds if every estimate held: ``_work``'s rules (each worker takes the next free run that fits
    whole, puts aside one that only reaches its next checkpoint, unless ``whole``, and takes those after the
    others), with a run's estimate fixed at the start and a run without one holding its worker to the stop."""
    stop = budget - stop_margin(budget)
    left = in_order([Planned(j, *estimate_and_source(j, jobs, known)) for j in jobs if j.cfg.name not in known],
                    order, claims)
    todo = [p for p in left if may_start(p, runs_root, stop, whole)]
    taken: set[str] = set()
    free = [(0.0, w) for w in range(min(workers, len(todo)))]  # (when it is free, worker)
    queues = {w: [(False, p) for p in todo] for _, w in free}  # (put aside, run): its pass, then what it put aside
    while free:
        free.sort()
        t, w = free.pop(0)
        while queues[w]:
            aside, p = queues[w].pop(0)
            if p.job.cfg.name in taken:
                continue
            if not aside and not fits(p.need, stop - t):
                if not whole and fits(to_checkpoint(p.job, p.need, runs_root), stop - t):
                    queues[w].append((True, p))
                continue
            if aside and not fits(to_checkpoint(p.job, p.need, runs_root), stop - t):
                continue
            taken.add(p.job.cfg.name)
            p.start = t
            finish = t + START_SECONDS + p.need if p.need is not None else math.inf
            if finish <= stop:
                p.end = finish
                free.append((finish, w))
            break
    return left


def plan_lines(planned: list[Planned], budget: float, workers: int, device: str) -> list[str]:
    """``plan`` for people: a line per run left and the counts."""
    lines = [f"[plan] {workers} worker(s), {budget:g} s on {device}, if every estimate held:"]
    for p in planned:
        cfg, (preset, label) = p.job.cfg, p.job.labels[0]
        need = f"{p.need:.0f} s ({p.source})" if p.need is not None else "no estimate"
        what = ("not started" if p.start is None else f"from {p.start:.0f} s to {p.end:.0f} s: finishes"
                if p.end is not None else f"from {p.start:.0f} s: cut short at the stop, its checkpoints kept")
        lines.append(f"[plan] {preset} {label}, seed {cfg.seed}, {need}: {what}")
    done = sum(p.end is not None for p in planned)
    cut = sum(p.start is not None and p.end is None for p in planned)
    lines.append(f"[plan] {done} of {len(planned)} runs left would finish, {cut} would be cut short, "
                 f"{len(planned) - done - cut} not started")
    unknown = sum(p.need is None for p in planned)
    none = f", and {unknown} {'run has' if unknown == 1 else 'runs have'} none" if unknown else ""
    lines.append(f"[plan] the runs left need {sum(p.need or 0.0 for p in planned):.0f} s of one worker by their "
                 f"estimates{none}")
    return lines


def _finished(jobs: list[Job], runs_root: Path, known: dict[str, dict]) -> dict[str, dict]:
    """``known`` updated with the summaries of the jobs' runs finished in ``runs_root``, by run folder name."""
    for job in jobs:
        if job.cfg.name not in known and (s := finished_run(runs_root, job.cfg)) is not None:
            known[job.cfg.name] = s
    return known


def _saved(suite: list[PresetRuns], jobs: list[Job]) -> dict[str, dict]:
    """The summaries of the jobs' runs that the presets' results folders hold (summaries.json, then
    ``FINISHED``), by run folder name, their rounds to target re-read at each run's target."""
    saved: dict[str, dict] = {}
    for p in suite:
        saved.update(saved_runs(p.out_dir))
    return {job.cfg.name: at_target(saved[job.cfg.name], job.cfg) for job in jobs if job.cfg.name in saved}


def worker_device(device: str, worker: int, gpus: int) -> str:
    """The device worker ``worker`` (0, 1, ...) trains on: plain ``cuda`` spreads the workers over the ``gpus``
    visible GPUs (``cuda:{worker mod gpus}``); ``cuda:N`` pins every worker to N, and any other device is kept."""
    if device != "cuda" or gpus < 1:
        return device
    return f"cuda:{worker % gpus}"


def _work(todo: list[Job], jobs: list[Job], runs_root: Path, stop_at: float, threads: int, progress: bool,
          worker: int, known: dict[str, dict], failed: Path, whole: bool = False) -> None:
    """A worker process: trains every run of ``todo`` it can claim whose estimate (from all the suite's ``jobs``
    and the runs ``known`` finished) fits before ``stop_at`` (time.monotonic, one clock for every process of the
    machine; whole, under ``whole``), on its share of the GPUs (``worker_device``), but none that ``failed`` (a
    folder) records as failed in this call."""
    import torch

    # SIGTERM ends the worker as an exit would (locks released, its semaphores unregistered) at the next
    # bytecode; a run folder survives any stop, and SIGKILL follows if the device holds the worker up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(0))  # the same stop at the budget's end, whatever happens
    signal.setitimer(signal.ITIMER_REAL, max(stop_at + TERM_GRACE - time.monotonic(), 0.01))
    threading.Thread(target=_stop_with_parent, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the suite process, which stops the workers
    torch.set_num_threads(threads)
    # counted here, in the spawned worker (CUDA_VISIBLE_DEVICES applies): the suite process never touches CUDA
    gpus = torch.cuda.device_count() if any(device_type(j.cfg.device) == "cuda" for j in todo) else 0
    deferred: list[Job] = []  # runs that cannot finish in time but can reach their next checkpoint: after the others
    for partial, runs in ((False, todo), (True, deferred)):
        for job in runs:
            _train_if_it_fits(job, jobs, runs_root, stop_at, known, deferred, partial, progress, worker, gpus,
                              failed, whole)


def _stop_with_parent() -> None:
    """In a worker's thread: once the suite process is gone (its sentinel, a pipe, closes even at SIGKILL), the
    worker's SIGTERM stop; no orphan goes on holding the cores or the device."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    os.kill(os.getpid(), signal.SIGTERM)


def _train_if_it_fits(job: Job, jobs: list[Job], runs_root: Path, stop_at: float, known: dict[str, dict],
                      deferred: list[Job], partial: bool, progress: bool, worker: int, gpus: int = 0,
                      failed: Path | None = None, whole: bool = False) -> None:
    """Returns None; trains ``job``'s run if this worker (1, 2, ...) gets its lock and it fits before ``stop_at``:
    whole, or (``partial``) up to its next checkpoint, so that a run longer than any budget still advances; a run
    that only fits that way the first time is put on ``deferred``, unless ``whole`` (then only a run with an
    estimate that fits whole starts). Plain ``cuda`` runs on the worker's share of the
    ``gpus`` (``worker_device``). A run that raises an unforeseen error is recorded in ``failed`` (a file named
    after its folder, holding where it failed) and the error ends the worker; a run recorded there is skipped."""
    cfg, where = job.cfg, f"{job.labels[0][0]} {job.labels[0][1]}, seed {job.cfg.seed}"
    with run_lock(cfg, wait=False) as mine:
        if not mine:
            return  # a sibling or another bench process is training it
        if cfg.name in _finished(jobs, runs_root, known):
            return  # finished before we got its lock
        if failed is not None and (failed / cfg.name).exists():
            return  # it failed in this call: one attempt a call (the next call tries it again)
        need, left = estimate(job, jobs, known), stop_at - time.monotonic()
        step = to_checkpoint(job, need, runs_root)
        if whole and need is None:
            print(f"[suite {worker}] {where}: not started, no estimate (--whole-runs starts only runs that finish)",
                  flush=True)
            return
        if not fits(need, left):
            if not partial and not whole and fits(step, left):
                deferred.append(job)
                return
            if not (partial and fits(step, left)):
                print(f"[suite {worker}] {where}: not started, {left:.0f} s left: too few for "
                      + (f"its estimated {need:.0f} s" if need is not None else "a run's start"), flush=True)
                return
        done = _checkpoint_round(runs_root / cfg.name)
        device = worker_device(cfg.device, worker - 1, gpus)  # the device is no part of the run (its folder's name)
        print(f"[suite {worker}] {where}: {runs_root / cfg.name}"
              + (f" on {device}" if device != cfg.device else "")
              + (f", resumed after round {done}" if done else "")
              + (f", estimated {need:.0f} s" if need is not None else ", no estimate"), flush=True)
        try:
            summary = run_one(cfg.replace(device=device), progress)
        except HetflError as e:  # this run's problem (say a live `hetfl run --resume` of it): go on
            print(f"hetfl: error: {where}: {e}", flush=True)
            return
        except Exception:  # a bug or a failing device: recorded before the worker ends, so no sibling retries it
            if failed is not None:
                (failed / cfg.name).write_text(where)
            print(f"[suite {worker}] {where}: failed; this worker ends and another takes its place (traceback "
                  "below)", flush=True)
            raise
        for path in job.finished_files:
            _record_finished(path, runs_root, cfg, summary)
        known[cfg.name] = summary


def _run_workers(todo: list[Job], jobs: list[Job], runs_root: Path, stop_at: float, workers: int,
                 progress: bool, known: dict[str, dict], failed: Path, whole: bool = False) -> list[int]:
    """Start the worker processes on ``todo`` and stop them by ``stop_at`` (SIGTERM, then SIGKILL); a worker that
    a failed run ended (one more run recorded in ``failed``) is replaced by a new one of the same number; returns
    every worker's exit code."""
    cuda = any(device_type(j.cfg.device) == "cuda" for j in todo)
    # CPU: the cores are the workers' to share (OMP_NUM_THREADS each where set: a suite beside other work); CUDA: a
    # worker mostly launches kernels (one thread each, as the twelve `hetfl bench reefl-20ng --device cuda`
    # processes of docs/benchmarks.md ran)
    threads = 1 if cuda else threads_each(workers)
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA or torch threads

    def start(worker: int) -> multiprocessing.Process:
        p = ctx.Process(target=_work, args=(todo, jobs, runs_root, stop_at, threads, progress, worker, known, failed,
                                            whole))
        p.start()
        return p

    procs: list[multiprocessing.Process] = []  # every worker started; the last of each number is in `slots`
    try:
        slots = []
        for i in range(min(workers, len(todo))):  # a worker more than the runs would only start and stop
            slots.append(start(i + 1))
            procs.append(slots[-1])
        while time.monotonic() < stop_at:
            for i, p in enumerate(slots):  # once per failed run: a worker failing at its start is not restarted
                if p.exitcode and p.exitcode > 0 and len(procs) - len(slots) < len(list(failed.iterdir())):
                    slots[i] = start(i + 1)
                    procs.append(slots[i])
            if not (alive := {p.sentinel: p for p in slots if p.exitcode is None}):
                break
            for ended in multiprocessing.connection.wait(list(alive), timeout=max(stop_at - time.monotonic(), 0)):
                alive[ended].join()  # its sentinel may be ready before its exit code is: read above, that is None
    finally:  # also on Ctrl-C: never leave a worker on the device
        for p in procs:
            if p.is_alive():
                p.terminate()
        grace_ends = time.monotonic() + TERM_GRACE
        for p in procs:
            p.join(timeout=max(grace_ends - time.monotonic(), 0))
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    return [p.exitcode for p in procs]


def run_suite(presets: list[str], time_budget: float, workers: int = 1, device: str | None = None,
              out: str | None = None, runs_dir: str | None = None, rounds: int | None = None,
              seeds: list[int] | None = None, progress: bool = True, reuse_saved: bool = False,
              plan_only: bool = False, order: str = "shortest", whole_runs: bool = False) -> dict:
    """Train what fits of the presets' runs within ``time_budget`` seconds and write the finished presets' tables
    (``reuse_saved``: the runs their results folders already hold count as finished); returns counts: finished
    (this call), left, estimated_seconds_left, unestimated (runs left without an estimate), tables (the tables
    written) and exit_code (1 if a worker failed). ``plan_only``: train nothing, print ``plan`` (on any machine: a
    time-limited job's plan is made before the job) and return {"planned": its list, "exit_code": 0}. ``order``:
    which runs the workers take first (``ORDERS``). ``whole_runs``: start only runs whose estimate fits whole (the
    module's docstring)."""
    started = time.monotonic()
    import torch  # noqa: F401  (now, inside the budget's clock: the estimates read checkpoints with it)

    if not (isinstance(time_budget, (int, float)) and math.isfinite(time_budget) and time_budget > 0):
        raise HetflError(f"bench suite: --time-budget must be a number of seconds > 0, not {time_budget}")
    if not (isinstance(workers, int) and workers >= 1):
        raise HetflError(f"bench suite: --workers must be an integer >= 1, not {workers}")
    in_order([], order)  # an unknown order: an error now
    for path, flag in ((out, "--out"), (runs_dir, "--runs-dir")):
        if path and Path(path).exists() and not Path(path).is_dir():
            raise HetflError(f"bench suite: {flag} {path} is a file; give a folder")
    if device is not None and not plan_only:
        from ..sim import resolve_device

        resolve_device(device)  # cuda asked for on a machine without it: an error now, not in every worker
    overrides = {k: v for k, v in (("rounds", rounds), ("device", device)) if v is not None}
    runs_root = Path(runs_dir or Path("runs") / "bench")
    suite = load_suite(presets, out, runs_root, overrides, seeds)
    jobs = suite_jobs(suite)

    known = _finished(jobs, runs_root, _saved(suite, jobs) if reuse_saved else {})
    if plan_only:
        planned = plan(jobs, known, runs_root, time_budget, workers, order, whole_runs, claim_runs(suite))
        print("\n".join(plan_lines(planned, time_budget, workers, device or "cpu")), flush=True)
        return {"planned": planned, "exit_code": 0}
    before = set(known)
    stop_at = started + time_budget - stop_margin(time_budget)
    # only runs that may fit now, in the suite's order: a suite with nothing to do starts no process
    left = stop_at - time.monotonic()
    todo = [p.job for p in in_order([Planned(j, estimate(j, jobs, known), "") for j in jobs
                                     if j.cfg.name not in known], order, claim_runs(suite))
            if may_start(p, runs_root, left, whole_runs)]
    with tempfile.TemporaryDirectory(prefix="hetfl-suite-failed-") as folder:
        failures = Path(folder)
        codes = (_run_workers(todo, jobs, runs_root, stop_at, workers, progress, known, failures, whole_runs)
                 if todo else [])
        crashed = {f.name: f.read_text() for f in sorted(failures.iterdir())}
    print(f"[suite] {'workers stopped' if todo else 'no run to start'} after {time.monotonic() - started:.1f} s "
          f"of the {time_budget:g} s budget", flush=True)

    _finished(jobs, runs_root, known)
    tables = []
    for p in suite:
        names = [cfg.name for _, _, cfg in p.configs]
        _record_missing(p, runs_root, known)  # a run finished before this call, or killed before it was recorded
        left = sum(name not in known for name in names)
        if left:
            flags = [f"--out {p.out_dir}", *([f"--seeds {','.join(map(str, seeds))}"] if seeds else []),
                     *([f"--rounds {rounds}"] if rounds else [])]
            print(f"[suite] {p.name}: {left} of {len(names)} runs left; interim table: "
                  f"hetfl bench {p.given} {' '.join(flags)} --report-only --reuse-saved", flush=True)
            continue
        if (p.out_dir / "table.md").exists() and set(names) <= _saved_by_run_name(p.out_dir / "summaries.json").keys():
            # nothing to add: rewritten, its regenerate line would name this call's options (--seeds, say)
            print(f"[suite] {p.name}: all {len(names)} runs finished; its table already holds them", flush=True)
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # the table itself is in the file; say where
            run_bench(p.given, out=str(p.out_dir) if out else None, runs_dir=runs_dir, overrides=overrides,
                      seeds=seeds, progress=False, reuse_saved=True)  # every run from FINISHED: none trained
        tables.append(p.out_dir / "table.md")
        print(f"[suite] {p.name}: all {len(names)} runs finished; table written to {p.out_dir / 'table.md'}",
              flush=True)

    unfinished = [j for j in jobs if j.cfg.name not in known]
    estimates = [estimate(j, jobs, known) for j in unfinished]
    seconds = sum(e for e in estimates if e is not None)
    unestimated = sum(e is None for e in estimates)
    print(f"[suite] runs finished in this call: {len(set(known) - before)}; runs left: {len(unfinished)}; "
          f"estimated device-seconds left: {seconds:.0f}"
          + " (a run: its own rounds' pace, else that of its label's other runs, or of runs doing the same work"
            " per round, on its device)"
          + (f", and {unestimated} runs with nothing to estimate from" if unestimated else ""), flush=True)
    for name, where in crashed.items():
        print(f"hetfl: error: {where} ({name}) failed and was not retried in this call; its traceback is above",
              flush=True)
    failed = [c for c in codes if c is not None and c > 0]  # negative: killed by a signal, ours
    if failed:
        print(f"hetfl: error: {len(failed)} suite worker(s) failed (exit codes {failed}); see their messages above",
              flush=True)
    return {"finished": len(set(known) - before), "left": len(unfinished), "estimated_seconds_left": seconds,
            "unestimated": unestimated, "tables": tables, "exit_code": 1 if failed else 0}


def _record_missing(p: PresetRuns, runs_root: Path, known: dict[str, dict]) -> None:
    """Add to ``p``'s FINISHED file every finished run of ``p`` that its results folder lacks (as ``hetfl bench``
    records the runs it reuses); a run its summaries.json holds is not written again."""
    held = saved_runs(p.out_dir)
    for _, _, cfg in p.configs:
        if cfg.name in known and cfg.name not in held:
            _record_finished(p.out_dir / FINISHED, runs_root, cfg, known[cfg.name])

