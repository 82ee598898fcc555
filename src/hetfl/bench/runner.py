"""``hetfl bench PRESET``: run every (run, seed) of a preset and write a mean ± std report with curves.

A preset is a TOML file:

* ``title``, ``description`` and ``seeds``;
* ``[base]``: config options shared by every run; ``[[runs]]``: a ``label`` plus the options
  that differ;
* ``[report]`` (optional): ``models = true`` adds a table of every evaluated model of every run
  (the levels' and widths' sub-models), ``costs = true`` adds their parameters, MACs and CPU
  latency to it, measured one after the other in this process; ``levels = true`` adds each level's
  model, its width and depth ratios and its accuracy, as a table and ``levels.png`` (``bench.levels``);
* ``[[claims]]`` (optional): a paper's claim checked on the results: ``claim`` (text) and one of
  ``better`` + ``worse`` (labels; a list on one side for "every one of"), ``better`` +
  ``at_least`` (a threshold), or ``gain`` + ``exceeds_gain`` (two pairs of labels; ``exceeds_metric``
  for the second pair, e.g. another model of the same runs); ``metric``
  (default ``accuracy``, see ``report.metric_value``), ``worse_metric`` (one, or one per worse
  label), ``lower_is_better`` (``report.check_claim``). Convergence is claimed on
  ``rounds_to_target`` (the runs' ``target_accuracy``), never on ``best_round``. A cost claim:
  ``cost_ratio = [A, B]`` (two evaluated models), ``cost`` (params, macs or latency_ms), ``better``
  (the run) and ``at_least`` (the ratio A / B), checked on the costs table (``costs = true``); a latency
  timed while other processes kept half a core or more busy decides none (``report.BUSY_CORES``): pause the
  machine's other work before ``--report-only``;
* ``diagnosis`` (optional): Markdown under the claims, why the claims that fail fail, with the
  controlled experiment that shows it (the numbers it quotes are the tables' own, so a rerun that
  changes them must change the text).

``hetfl bench PRESET --report-only`` rewrites ``table.md`` from the ``summaries.json`` already in the
results folder (the preset's current claims and targets, rounds re-read off the saved curves),
training nothing.

Run folders are named by the method and a hash of the resolved config, in one folder shared by
all presets (default ``runs/bench``): a run that two presets share is trained once, a finished
run is reused and an interrupted one resumed, so a long bench can be stopped and started again,
and several bench processes can share the work (a lock per run).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tomllib
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from ..checkpoint import has_checkpoint
from ..config import Config
from ..methods import config_from, load_config
from ..errors import HetflError, read_text_file
from ..machine import OthersBusy, cores
from ..plots import plot_curves, plot_levels
from ..report import as_list, bench_report, rounds_to_target
from ..rundir import RunDirBusy, atomic_write_text
from ..sim import Simulation

PILOTS = "pilots"  # beside the presets' results folders: the pilots at long horizons (scripts/plateau.py)
PRESET_KEYS = {"title", "description", "seeds", "base", "runs", "report", "claims", "diagnosis", "extends"}


def preset_names() -> list[str]:
    """Names of the presets shipped with hetfl."""
    return sorted(p.name[:-5] for p in resources.files("hetfl.presets").iterdir() if p.name.endswith(".toml"))


def load_preset(name_or_path: str) -> tuple[str, dict]:
    """(name, parsed TOML) of a shipped preset or a preset file, ``extends`` resolved (``_extended``) and kept as
    the preset it names (a file: its path, found beside the preset extending it)."""
    name, preset = _parsed_preset(name_or_path, ())
    unknown = set(preset) - PRESET_KEYS
    if unknown:
        raise HetflError(f"bench preset {name_or_path}: unknown key(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(PRESET_KEYS))}")
    _check_structure(name_or_path, preset)
    labels = [entry.get("label") or entry.get("method", "run") for entry in preset["runs"]]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise HetflError(f"bench preset {name_or_path}: run label(s) {', '.join(twice)} name more than one run; "
                         "give each [[runs]] entry its own label")
    for claim in preset.get("claims", []):
        problem = _claim_problem(claim, labels)
        if problem:
            raise HetflError(f"bench preset {name_or_path}: claim '{claim.get('claim', '')}' {problem}")
    return name, preset


def _parsed_preset(name_or_path: str, chain: tuple[str, ...]) -> tuple[str, dict]:
    """(name, parsed TOML) of a preset, its ``extends`` resolved; ``chain``: the presets extending it, outermost
    first, by ``_preset_key`` (a preset that extends itself, through others or not, is refused)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        text, name = read_text_file(path, f"bench preset {path}"), path.stem
    elif name_or_path in preset_names():
        text, name = resources.files("hetfl.presets").joinpath(f"{name_or_path}.toml").read_text(), name_or_path
    else:
        special = ["speed", "throughput", "scaling", "memory", "checkpoint", "chaos", "flower", "suite", "jobs"]
        raise HetflError(f"bench preset '{name_or_path}' is unknown; choose one of: "
                         f"{', '.join(preset_names() + special)}, or give a .toml file")
    try:
        preset = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HetflError(f"bench preset {name_or_path} is not valid TOML: {e}") from None
    parent = preset.pop("extends", None)
    if parent is None:
        return name, preset
    if not isinstance(parent, str):
        raise HetflError(f"bench preset {name_or_path}: extends must name a preset or a .toml file, not {parent!r}")
    if path.suffix == ".toml" and parent.endswith(".toml"):
        parent = str(path.parent / parent)  # a preset file's parent file: beside it
    chain = (*chain, _preset_key(name_or_path))
    if _preset_key(parent) in chain:
        loop = " -> ".join((*chain, _preset_key(parent)))
        raise HetflError(f"bench preset {name_or_path}: extends loops back: {loop}")
    try:
        _, inherited = _parsed_preset(parent, chain)
    except HetflError as e:
        raise HetflError(f"bench preset {name_or_path} extends {parent}: {e}") from None
    return name, {**_extended(inherited, preset), "extends": parent}


def _preset_key(name_or_path: str) -> str:
    """What names one preset however it is given: a preset file's resolved path, else the shipped preset's name."""
    path = Path(name_or_path)
    return str(path.resolve()) if path.suffix == ".toml" and path.exists() else name_or_path


OWN_WORDS = ("title", "description", "diagnosis")  # what a preset says of its own table: never inherited
MERGED_TABLES = ("base", "report")  # a preset extending another sets some of their keys


def _extended(parent: dict, child: dict) -> dict:
    """Preset ``child`` on top of ``parent`` (``extends``): the parent's runs, claims, seeds, ``base`` and
    ``report``, with each key the child sets replacing the parent's (in ``base`` and ``report``, key by key), and
    only the child's title, description and diagnosis: a longer horizon's table needs its own words, not a copy
    of the shorter one's verdicts."""
    merged = {key: value for key, value in parent.items() if key not in OWN_WORDS}
    for key, value in child.items():
        if key in MERGED_TABLES and isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = {**merged[key], **value}
        merged[key] = value
    return merged


# the type each key of a preset must have: text, a table, a list of tables, a list of seeds
_PRESET_TYPES = {"title": str, "description": str, "diagnosis": str, "base": dict, "report": dict, "runs": list,
                 "claims": list, "seeds": list, "extends": str}


def _check_structure(name: str, preset: dict) -> None:
    """Returns None; raises HetflError naming the first key of the preset whose value has the wrong shape."""
    for key, kind in _PRESET_TYPES.items():
        if key in preset and not isinstance(preset[key], kind):
            raise HetflError(f"bench preset {name}: {key} must be a {_TYPE_WORDS[kind]}, got "
                             f"{type(preset[key]).__name__}")
    if not preset.get("runs"):
        raise HetflError(f"bench preset {name} has no [[runs]] entries")
    for key in ("runs", "claims"):
        if not all(isinstance(entry, dict) for entry in preset.get(key, [])):
            raise HetflError(f"bench preset {name}: every entry of {key} must be a table ([[{key}]])")
    seeds = preset.get("seeds", [0])
    if not seeds or not all(type(s) is int and 0 <= s < 2 ** 32 for s in seeds):
        raise HetflError(f"bench preset {name}: seeds must be a non-empty list of integers in [0, 2^32), got {seeds}")


_TYPE_WORDS = {str: "text", dict: "table", list: "list"}


def _claim_problem(claim: dict, labels: list[str]) -> str | None:
    """Why a claim cannot be checked on runs named ``labels``, or None."""
    named = [x for k in ("better", "worse", "gain", "exceeds_gain") if k in claim for x in as_list(claim[k])]
    missing = [x for x in named if x not in labels]
    if missing:
        return f"names run(s) {missing} that the preset does not have; its runs: {', '.join(labels)}"
    if "best_round" in [claim.get("metric"), *as_list(claim.get("worse_metric", []))]:
        return ("is decided on best_round, which the horizon caps: claim convergence on rounds_to_target, with a "
                "target_accuracy that every compared run reaches")
    if "cost_ratio" in claim and (len(as_list(claim["cost_ratio"])) != 2 or "at_least" not in claim
                                  or claim.get("cost", "params") not in ("params", "macs", "latency_ms")):
        return "needs cost_ratio = [two models], at_least, and cost params, macs or latency_ms"
    if isinstance(claim.get("better"), list) and isinstance(claim.get("worse"), list):
        return "has lists on both sides: give one label on one side"
    if len(as_list(claim.get("worse_metric", []))) not in (0, 1, len(as_list(claim.get("worse", [])))):
        return "needs one worse_metric, or one per worse label"
    return None


# where a run is written, what its report looks for, how often it checkpoints by the clock and how long
# a Flower server waits for replies (which never change a simulated run's results, and were added after
# bench folders were named by these values)
NOT_THE_RUN = ("out", "name", "target_accuracy", "checkpoint_seconds", "round_timeout", "executor")


# The device a run computes on does not define it either: reefl-20ng's runs on this CPU and on an H100 gave
# the same evaluations, document for document (docs/results/reefl-20ng-cpu), as runs on different thread
# counts do. It was hashed before that was known, always at its default: every run is named as if on it, so the
# folders named then keep their names and a table can gather runs made on any device (each summary says which).
NAMED_ON_DEVICE = "cpu"


def run_values(cfg: Config) -> dict:
    """Everything that defines the run's results (not where it is written, what is reported or the device it
    computes on); an option added later is in it only when set (``Config.to_dict``), so earlier runs keep their
    folders."""
    return {**{k: v for k, v in cfg.to_dict().items() if k not in NOT_THE_RUN}, "device": NAMED_ON_DEVICE}


def config_key(cfg: Config) -> str:
    """A short hash of the run's values: its folder name."""
    return hashlib.sha256(json.dumps(run_values(cfg), sort_keys=True).encode()).hexdigest()[:10]


def preset_configs(preset: dict, overrides: dict, seeds: list[int] | None) -> list[tuple[str, int, Config]]:
    """Every (label, seed, validated config) of the preset, checked before anything runs."""
    seeds = seeds or preset.get("seeds", [0])
    configs = []
    for entry in preset["runs"]:
        entry = dict(entry)
        label = entry.pop("label", None) or entry.get("method", "run")
        for seed in seeds:
            values = {**preset.get("base", {}), **entry, **overrides, "seed": seed}
            configs.append((label, seed, config_from(values, source=f"preset run '{label}'").validate()))
    return configs


def same_run(a: Config, b: Config) -> bool:
    """Whether two configs define the same run, wherever it is written and whatever its report looks for."""
    return run_values(a) == run_values(b)


def finished_run(runs_root: Path, cfg: Config) -> dict | None:
    """The summary of a finished run of ``cfg`` under ``runs_root`` (any label's folder), or None;
    its rounds to a target are those to ``cfg``'s target, read off its curve."""
    for folder in sorted(runs_root.glob(f"*-{config_key(cfg)}-s{cfg.seed}")):
        if (folder / "summary.json").exists() and (folder / "config.json").exists():
            if same_run(load_config(folder / "config.json"), cfg):
                summary = read_json(folder / "summary.json")
                if not _is_summary(summary):
                    raise HetflError(f"{folder / 'summary.json'} is not a run's summary; delete it and the bench "
                                     "will resume the run")
                return at_target(summary, cfg)
    return None


def at_target(summary: dict, cfg: Config) -> dict:
    """``summary`` with the target and the rounds to it of ``cfg``, read off the summary's curve."""
    curve = summary.get("curve")
    if not isinstance(curve, list) or not all(isinstance(p, list) and len(p) == 2 for p in curve):
        raise HetflError(f"the saved summary of run {cfg.name} has no curve of (round, accuracy) pairs; delete it "
                         "(summaries.json, finished-runs.json or its run folder's summary.json) to train it again")
    return {**summary, "target_accuracy": cfg.target_accuracy,
            "rounds_to_target": rounds_to_target(summary["curve"], cfg.target_accuracy)}


def run_one(cfg: Config, progress: bool) -> dict:
    """The summary of one bench run: reused if finished, resumed if interrupted, else run."""
    run_dir = Path(cfg.out) / cfg.name
    if (done := finished_run(Path(cfg.out), cfg)) is not None:
        return done
    if has_checkpoint(run_dir):  # checkpoint.old too: a kill between the renames of a checkpoint leaves only it
        try:
            return Simulation.resume(run_dir, device=cfg.device).run(progress=progress)  # the device asked now
        except RunDirBusy:
            raise  # a live process (a `hetfl run --resume`) is writing it: never delete its folder
        except HetflError:
            pass  # a stale or foreign folder: start again below
    shutil.rmtree(run_dir, ignore_errors=True)
    return Simulation(cfg).run(progress=progress)


@contextmanager
def run_lock(cfg: Config, wait: bool):
    """Hold the lock of ``cfg``'s run (True), or yield False if another process holds it and ``wait`` is off.

    Two ``hetfl bench`` processes (say one per core) then share the work of a preset, or of two
    presets with runs in common, and never train the same run twice or at once.
    """
    locks = Path(cfg.out) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{config_key(cfg)}-s{cfg.seed}", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_bench(name_or_path: str, out: str | None = None, runs_dir: str | None = None,
              overrides: dict | None = None, seeds: list[int] | None = None, progress: bool = True,
              report_only: bool = False, reuse_saved: bool = False) -> Path:
    """Run a preset; returns the results folder holding table.md, summaries.json and curves.png.

    Runs another process is training are put off to the end (then waited for), so several
    processes can work through the same presets together. ``report_only``: train nothing, rewrite
    table.md and curves.png from the folder's summaries.json (and ``FINISHED`` with ``reuse_saved``: an
    interim table). Each run's summary is added to the folder's ``FINISHED`` as soon as it is done (and
    dropped from it once summaries.json holds it), so an interrupted bench's finished runs can be committed.
    ``reuse_saved``: a run whose summary the folder's summaries.json or ``FINISHED`` holds under the same
    run folder name (method, hash of the run's values, seed) is taken from there instead of trained again:
    a committed table's runs outlive the machine's runs folder, and a preset can gain rows or seeds without re-running the
    rest. ``seeds``: the table keeps the saved runs of the other seeds under the same run folder names.
    Only for a table made by the current code: the name says nothing of code that changed
    under the same options.
    """
    name, preset = load_preset(name_or_path)
    runs_root = Path(runs_dir or Path("runs") / "bench")
    configs = _named_configs(preset, overrides or {}, seeds, runs_root)
    out_dir = Path(out or Path("results") / name)
    if report_only:  # with reuse_saved, also the finished runs of a bench that has not ended: an interim table
        results = saved_results(out_dir / "summaries.json", configs,
                                _saved_by_run_name(out_dir / FINISHED) if reuse_saved else None)
    else:
        saved = saved_runs(out_dir) if reuse_saved else {}
        results = _train(name, configs, runs_root, progress, saved,
                         lambda cfg, summary: _record_finished(out_dir / FINISHED, runs_root, cfg, summary))
        if seeds:
            results = _with_saved_seeds(results, out_dir / "summaries.json", preset, overrides or {}, seeds, runs_root)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "summaries.json", json.dumps(results, indent=1) + "\n")
        _forget_finished(out_dir / FINISHED, runs_root, {cfg.name for _, _, cfg in configs})
    plot_curves({label: [s["curve"] for s in runs] for label, runs in results.items()},
                out_dir / "curves.png", title=preset.get("title", name))
    resolved: dict[str, Config] = {}
    for label, _, cfg in configs:
        if label in results:
            resolved.setdefault(label, cfg)
    options = preset.get("report", {})
    costs = _model_costs(resolved) if options.get("costs") else None
    seeds_shown = sorted({s["seed"] for runs in results.values() for s in runs})
    seeds_flag = ([] if not seeds else [f"--seeds {','.join(map(str, seeds))}"] if seeds_shown == sorted(seeds)
                  else ["--reuse-saved"])  # the table also holds saved runs of other seeds
    if reuse_saved and report_only and "--reuse-saved" not in seeds_flag:
        seeds_flag.append("--reuse-saved")  # trains what the interim table lacks, keeping what it has
    missing = missing_runs(configs, results)
    command = " ".join([f"hetfl bench {name_or_path}", *([f"--out {out}"] if out else []), *seeds_flag,
                        *(f"--{k} {v}" for k, v in (overrides or {}).items())])
    report = bench_report(preset, results, command, models=options.get("models", False) or costs is not None,
                          costs=costs, missing=missing, pilots=pilots_of(name, out_dir.parent / PILOTS),
                          shorter=shorter_table(preset, out_dir.parent))
    if options.get("levels"):  # each level's model (ScaleFL Figure 2): levels.png and its numbers
        from .levels import level_accuracies, levels_table

        levels = level_accuracies(resolved, results)
        plot_levels(levels, out_dir / "levels.png", title=f"{preset.get('title', name)}: each level's model")
        report += ("\n\n## Each level's model\n\nThe model each level trains, the shares of the global model's width "
                   "and blocks it keeps, and its final accuracy on the global test set ([levels.png](levels.png); "
                   "ScaleFL Figure 2).\n\n" + levels_table(levels) + "\n")
    atomic_write_text(out_dir / "table.md", report)
    print(report)
    return out_dir


# what a preset extending another may change in [base] and still run the same rows, only longer
HORIZON_KEYS = frozenset({"rounds", "eval_every", "checkpoint_every"})


def shorter_table(preset: dict, folder: Path) -> tuple[str, dict[str, list[dict]]] | None:
    """(name, saved results by label) of the preset that ``preset`` extends, when it runs the same rows at fewer
    rounds (its [base] differs in ``HORIZON_KEYS`` only) and ``folder`` (the results folders' parent) holds its
    table; else None. The horizon's own gain, ``report.horizon_gains``."""
    if "extends" not in preset:
        return None
    name, shorter = load_preset(preset["extends"])
    base, before = preset.get("base", {}), shorter.get("base", {})
    changed = {key for key in {*base, *before} if base.get(key) != before.get(key)}
    path = folder / name / "summaries.json"
    if (not changed <= HORIZON_KEYS or before.get("rounds", 0) >= base.get("rounds", 0)
            or preset["runs"] != shorter["runs"] or not path.exists()):
        return None
    return name, saved_results(path, _named_configs(shorter, {}, None, folder))


def pilots_of(name: str, folder: Path) -> list[dict]:
    """The pilots of preset ``name`` recorded in ``folder`` (``scripts/plateau.py --json``: the folder beside
    the preset's results folder, docs/results/pilots for docs/results/PRESET), each with its file's name, its
    device, its rounds and the rows it ran of this preset."""
    pilots = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(read_text_file(path, f"pilot record {path}"))
        except ValueError as e:
            raise HetflError(f"pilot record {path} is not JSON ({e}); rewrite it with scripts/plateau.py --json") \
                from None
        if record.get("presets", {}).get(name):
            pilots.append({"file": f"{PILOTS}/{path.name}", "device": record.get("device", "cpu"),
                           "rounds": record["rounds"], "rows": record["presets"][name]})
    return pilots


def _named_configs(preset: dict, overrides: dict, seeds: list[int] | None,
                   runs_root: Path) -> list[tuple[str, int, Config]]:
    """The preset's (label, seed, config)s, each config writing to its run folder under ``runs_root``, named by
    method, hash of its values and seed."""
    return [(label, seed, cfg.replace(out=str(runs_root), name=f"{cfg.method}-{config_key(cfg)}-s{seed}"))
            for label, seed, cfg in preset_configs(preset, overrides, seeds)]


def _with_saved_seeds(results: dict[str, list[dict]], path: Path, preset: dict, overrides: dict, seeds: list[int],
                      runs_root: Path) -> dict[str, list[dict]]:
    """``results`` (this bench's, of ``seeds``, by label) plus the runs of the other seeds (the preset's and those
    ``path``, a summaries.json, holds) that ``path`` holds under the same run folder name (method, hash of its
    values, seed): a bench of some seeds adds to a table instead of dropping its other seeds."""
    saved = _saved_by_run_name(path)
    other_seeds = sorted({*preset.get("seeds", [0]), *(s["seed"] for s in saved.values())} - set(seeds))
    merged = {label: list(runs) for label, runs in results.items()}
    for label, _, cfg in _named_configs(preset, overrides, other_seeds, runs_root) if other_seeds else []:
        if (s := saved.get(cfg.name)) is not None:
            merged.setdefault(label, []).append(at_target(s, cfg))
    return {label: sorted(runs, key=lambda s: s["seed"]) for label, runs in merged.items()}


def _train(name: str, configs: list[tuple[str, int, Config]], runs_root: Path, progress: bool,
           saved: dict[str, dict] | None = None, finished=None) -> dict[str, list[dict]]:
    """The summaries of every (label, seed) run, by label: each trained, resumed or reused (from the runs
    folder, or from ``saved`` summaries by run folder name); ``finished(cfg, summary)`` is called after
    each run taken from the runs folder."""
    summaries: dict[int, dict] = {}
    for i, (label, seed, cfg) in enumerate(configs):
        if (s := (saved or {}).get(cfg.name)) is not None:
            print(f"[bench {name} {i + 1}/{len(configs)}] {label}, seed {seed}: {cfg.name}, its saved summary",
                  flush=True)
            summaries[i] = at_target(s, cfg)
    for wait in (False, True):
        for i, (label, seed, cfg) in enumerate(configs):
            if i in summaries:
                continue
            with run_lock(cfg, wait) as mine:
                if mine:
                    print(f"[bench {name} {i + 1}/{len(configs)}] {label}, seed {seed}: {runs_root / cfg.name}",
                          flush=True)
                    summaries[i] = run_one(cfg, progress)
                    if finished is not None:
                        finished(cfg, summaries[i])
    results: dict[str, list[dict]] = {}
    for i, (label, _, _) in enumerate(configs):
        results.setdefault(label, []).append(summaries[i])
    return results


def saved_results(path: Path, configs: list[tuple[str, int, Config]],
                  finished: dict[str, dict] | None = None) -> dict[str, list[dict]]:
    """The saved summaries of the preset's (label, seed)s that ``path`` (a summaries.json) holds, else that
    ``finished`` holds under the run's folder name, by label, their rounds to target re-read off their curves at
    the preset's targets; labels or seeds they lack are left out."""
    if not path.exists() and not finished:
        raise HetflError(f"--report-only rewrites a report from {path}, which does not exist: run the bench first"
                         f"{'' if finished is not None else ' (or add --reuse-saved to report its finished runs)'}")
    saved = ({(label, s["seed"]): s for label, runs in read_summaries(path).items() for s in runs}
             if path.exists() else {})
    results: dict[str, list[dict]] = {}
    for label, seed, cfg in configs:
        if (s := saved.get((label, seed)) or (finished or {}).get(cfg.name)) is not None:
            results.setdefault(label, []).append(at_target(s, cfg))
    return results


def missing_runs(configs: list[tuple[str, int, Config]], results: dict[str, list[dict]]) -> list[tuple[str, int]]:
    """The preset's (label, seed)s that ``results`` (by label) has no run of."""
    return [(label, seed) for label, seed, _ in configs if seed not in {s["seed"] for s in results.get(label, [])}]


def committed_results(folder: Path, preset: dict) -> tuple[dict[str, list[dict]], list[tuple[str, int]]]:
    """(results by label, the (label, seed)s not run yet) of a results folder, read as ``hetfl bench PRESET
    --report-only --reuse-saved --out FOLDER`` reads them: its summaries.json, then its ``FINISHED``."""
    configs = _named_configs(preset, {}, None, Path("runs") / "bench")  # run names only: nothing is read there
    results = saved_results(folder / "summaries.json", configs, _saved_by_run_name(folder / FINISHED))
    return results, missing_runs(configs, results)


FINISHED = "finished-runs.json"  # a results folder's summaries of the runs done so far, by run folder name


def read_json(path: Path):
    """The JSON document in ``path``; HetflError when it cannot be read or is not JSON."""
    try:
        return json.loads(read_text_file(path, str(path)))
    except ValueError as e:
        raise HetflError(f"{path} is not valid JSON ({e}); restore it, or delete it to train its runs again") from None


def _is_summary(s) -> bool:
    """Whether ``s`` can be a run's summary: a table with a seed (its curve is checked where it is read)."""
    return isinstance(s, dict) and type(s.get("seed")) is int


def read_summaries(path: Path) -> dict[str, list[dict]]:
    """The runs' summaries of a bench's summaries.json, by label, after checking its structure."""
    saved = read_json(path)
    if not isinstance(saved, dict) or not all(isinstance(runs, list) and all(map(_is_summary, runs))
                                              for runs in saved.values()):
        raise HetflError(f"{path} is not a bench's summaries (label -> list of run summaries); restore it, or delete "
                         "it to train its runs again")
    return saved


def read_finished(path: Path) -> dict[str, dict]:
    """The runs' summaries of a ``FINISHED`` file, by run folder name, after checking its structure."""
    saved = read_json(path)
    if not isinstance(saved, dict) or not all(isinstance(s, dict) for s in saved.values()):
        raise HetflError(f"{path} is not a table of finished runs' summaries; delete it to train its runs again")
    return saved


def saved_runs(out_dir: Path) -> dict[str, dict]:
    """The runs a bench's results folder holds (summaries.json, then ``FINISHED``), by run folder name."""
    return {**_saved_by_run_name(out_dir / "summaries.json"), **_saved_by_run_name(out_dir / FINISHED)}


def _saved_by_run_name(path: Path) -> dict[str, dict]:
    """The summaries a summaries.json (by label) or a ``FINISHED`` file (by name) holds, by their run folder's
    name; empty if there is no such file."""
    if not path.exists():
        return {}
    if path.name == FINISHED:
        return read_finished(path)
    saved = read_summaries(path)
    return {Path(s["run_dir"]).name: s for runs in saved.values() for s in runs if s.get("run_dir")}


@contextmanager
def _finished_lock(runs_root: Path):
    """Hold the lock on the ``FINISHED`` files of the benches sharing ``runs_root``."""
    (runs_root / ".locks").mkdir(parents=True, exist_ok=True)
    with open(runs_root / ".locks" / "finished-runs", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _record_finished(path: Path, runs_root: Path, cfg: Config, summary: dict) -> None:
    """Add one run's summary to ``path`` (a ``FINISHED`` file), under a lock: two bench processes may share it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _finished_lock(runs_root):
        done = read_finished(path) if path.exists() else {}
        done[cfg.name] = summary
        atomic_write_text(path, json.dumps(done, indent=1) + "\n")


def _forget_finished(path: Path, runs_root: Path, names: set[str]) -> None:
    """Drop the runs ``names`` (now in summaries.json) from ``path`` (a ``FINISHED`` file), removing it once
    empty: the finished runs of seeds or rows this bench did not ask for (another process's) stay."""
    if not path.exists():  # (no lock folder made where nothing was trained)
        return
    with _finished_lock(runs_root):
        if not path.exists():
            return
        rest = {name: s for name, s in read_finished(path).items() if name not in names}
        if rest:
            atomic_write_text(path, json.dumps(rest, indent=1) + "\n")
        else:
            path.unlink()


def _model_costs(resolved: dict[str, Config]) -> dict[str, dict[str, dict]]:
    """Per label and evaluated model: params, MACs and CPU latency, measured here one after the other, each row with
    the cores other processes kept busy while its label's latencies were timed (``others_busy_cores``, of ``cores``;
    ``report.check_cost_claim`` decides no latency claim on a busy machine)."""
    from ..costs import CLAIM_LATENCY, cost_rows
    from ..data import load_dataset
    from ..methods import build_method

    out, machine_cores = {}, cores()
    for label, cfg in resolved.items():
        data = load_dataset(cfg.dataset, cfg.data_dir or None, cfg.max_length)  # cached per process
        method = build_method(cfg, data.input_shape, data.num_classes)
        with OthersBusy() as others:
            rows = cost_rows(method.family, method.eval_specs(), cfg.batch_size, timing=CLAIM_LATENCY)
        out[label] = {r["label"]: {**r, "others_busy_cores": others.cores, "cores": machine_cores} for r in rows}
    return out
