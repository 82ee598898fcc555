"""Where a preset's runs plateau, read from pilot runs at a long horizon: a table's horizon from its plateau criterion.

    .venv/bin/python scripts/plateau.py RUNS_DIR PRESET... [--rounds 150] [--seeds 0] [--json OUT.json]
    .venv/bin/python scripts/plateau.py --table docs/results/LONGER --for PRESET... [--json OUT.json]

RUNS_DIR holds the pilot's run folders (``hetfl bench suite PRESET... --rounds 150 --seeds 0 --runs-dir RUNS_DIR``),
finished or not: each run's headline-accuracy curve is read from its metrics.jsonl, so a run the time budget cut
short still says how far it got. For every row it prints the last evaluated round, the accuracy there, the
last-third gain at that horizon (``report.late_gain``, the tables' criterion) and the *plateau round*: the
smallest evaluated round T from which every horizon T' >= T the curve reaches has a last-third gain under the
threshold (1 point). A horizon read this way holds for the learning-rate schedule the pilot ran; a schedule that
depends on the horizon (cosine, step) would need its own pilot at that horizon.

With ``--table``, the pilot is a committed table at a longer horizon (its summaries.json keeps every run's curve).
``--for`` files the readings under the presets whose rows the pilot reran (same labels) rather than under the
presets it ran: ``--table docs/results/depthfl-20ng-600-fedavg --for depthfl-20ng-300``, or
``runs/bench reefl-r8-frozen-200 --rounds 200 --for reefl-r8-frozen reefl-r8``.

``--json`` writes the curves and readings (small: the committed record of the pilot, in docs/results/pilots, where
``hetfl bench`` reads it for the "Horizon" section of every table whose rows it ran); ``--device`` says in words what
the pilot ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from hetfl.bench.suite import load_suite
from hetfl.report import headline_accuracy, late_gain

THRESHOLD = 0.01


def curve_of(run_dir: Path) -> tuple[list[tuple[int, float]], float]:
    """The run's (round, headline accuracy) at every evaluation, and its training seconds so far."""
    cfg = json.loads((run_dir / "config.json").read_text())
    curve, seconds = [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by the kill that ended the pilot
            continue
        seconds += record.get("seconds") or 0.0
        if record.get("eval"):
            curve.append((record["round"], headline_accuracy(record["eval"]["global"], cfg["inference"])))
    return curve, seconds


def plateau_round(curve: list[tuple[int, float]], threshold: float = THRESHOLD) -> int | None:
    """The smallest evaluated round T such that every evaluated horizon T' >= T has a last-third gain under
    ``threshold`` (None if even the last horizon does not)."""
    found = None
    for i in range(len(curve) - 1, -1, -1):
        gain = late_gain(curve[:i + 1], curve[i][0])
        if gain is None or gain >= threshold:
            break
        found = curve[i][0]
    return found


def reading(label: str, seed: int, run: str, curve: list, seconds: float, threshold: float) -> dict:
    """What a pilot says of one run: its last evaluated round, last-third gain there and plateau round."""
    last = curve[-1][0] if curve else 0
    return {"label": label, "seed": seed, "run": run, "curve": curve, "train_seconds": seconds, "last_round": last,
            "late_gain": late_gain(curve, last) if curve else None, "plateau_round": plateau_round(curve, threshold)}


def pilot_runs(args) -> Iterator[tuple[str, list[tuple[str, int, str, Path | dict]]]]:
    """(preset, [(label, seed, run name, run folder or saved summary)]) of every preset the pilot ran (a --table:
    one, named after its folder)."""
    if args.table:
        yield args.table.name, [(label, s["seed"], Path(s.get("run_dir", "")).name, s)
                                for label, runs in args.summaries.items() for s in runs]
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    for p in load_suite(args.presets, None, args.runs_dir, {"rounds": args.rounds}, seeds):
        yield p.name, [(label, seed, cfg.name, args.runs_dir / cfg.name) for label, seed, cfg in p.configs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path, nargs="?", help="the pilot's run folders (not with --table)")
    parser.add_argument("presets", nargs="*", help="the presets the pilot ran (not with --table)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--table", type=Path, help="read the curves of a committed results folder instead "
                                                   "(its summaries.json: a table at a longer horizon)")
    parser.add_argument("--for", dest="targets", nargs="+", metavar="PRESET",
                        help="file the readings under these presets (rows of the same labels; default: the presets "
                             "the pilot ran)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="what the pilot ran on, in words (the tables quote it)")
    args = parser.parse_args(argv)
    if args.table is None and (args.runs_dir is None or not args.presets):
        parser.error("give RUNS_DIR and the PRESETs the pilot ran, or --table")
    if args.table is not None and args.runs_dir is not None:
        parser.error("--table reads a results folder: give no RUNS_DIR or PRESET with it")
    if args.table:  # the table's runs, its own horizon and seeds
        summaries = args.table / "summaries.json"
        if not summaries.is_file():
            parser.error(f"{args.table} has no summaries.json, which --table reads (a complete table's folder has one)")
        args.summaries = json.loads(summaries.read_text())
        runs = [r for rows in args.summaries.values() for r in rows]
        args.rounds = max(r["rounds"] for r in runs)
        args.seeds = ",".join(map(str, sorted({r["seed"] for r in runs})))
    record: dict = {"rounds": args.rounds, "seeds": [int(s) for s in args.seeds.split(",")],
                    "threshold": args.threshold, "device": args.device, "presets": {}}
    for preset, runs in pilot_runs(args):
        print(f"\n## {preset} (pilot: {args.rounds} rounds, seeds {args.seeds})\n")
        print("| row | seed | last round | accuracy | last-third gain | plateau round | train s |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for label, seed, run, source in runs:
            if isinstance(source, dict):
                curve, seconds = [tuple(p) for p in source["curve"]], source.get("wall_seconds") or 0.0
            elif (source / "metrics.jsonl").exists():
                curve, seconds = curve_of(source)
            else:
                print(f"| {label} | {seed} | not run | | | | |")
                continue
            row = reading(label, seed, run, curve, seconds, args.threshold)
            rows.append(row)
            cells = [label, seed, row["last_round"], f"{100 * curve[-1][1]:.2f}" if curve else "-",
                     "-" if row["late_gain"] is None else f"{100 * row['late_gain']:+.2f}",
                     row["plateau_round"] or f"not by {row['last_round']}", f"{seconds:.0f}"]
            print("| " + " | ".join(map(str, cells)) + " |")
        for target in args.targets or [preset]:
            record["presets"].setdefault(target, []).extend(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())
