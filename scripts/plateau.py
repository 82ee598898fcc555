"""Where a preset's runs plateau, read from pilot runs at a long horizon (issue 36: horizons from the criterion).

    .venv/bin/python scripts/plateau.py RUNS_DIR PRESET... [--rounds 150] [--seeds 0] [--json OUT.json]

RUNS_DIR holds the pilot's run folders (``hetfl bench suite PRESET... --rounds 150 --seeds 0 --runs-dir RUNS_DIR``),
finished or not: each run's headline-accuracy curve is read from its metrics.jsonl, so a run the time budget cut
short still says how far it got. For every row it prints the last evaluated round, the accuracy there, the
last-third gain at that horizon (``report.late_gain``, the tables' criterion) and the *plateau round*: the
smallest evaluated round T from which every horizon T' >= T the curve reaches has a last-third gain under the
threshold (1 point). A horizon read this way holds for the learning-rate schedule the pilot ran; a schedule that
depends on the horizon (cosine, step) would need its own pilot at that horizon.

``--json`` writes the curves and readings (small: the committed record of the pilot, in docs/results/pilots, where
``hetfl bench`` reads it for the "Horizon" section of every table whose rows it ran); ``--device`` says in words what
the pilot ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="what the pilot ran on, in words (the tables quote it)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    record: dict = {"rounds": args.rounds, "seeds": seeds, "threshold": args.threshold, "device": args.device,
                    "presets": {}}
    for p in load_suite(args.presets, None, args.runs_dir, {"rounds": args.rounds}, seeds):
        print(f"\n## {p.name} (pilot: {args.rounds} rounds, seeds {args.seeds})\n")
        print("| row | seed | last round | accuracy | last-third gain | plateau round | train s |")
        print("|---|---|---|---|---|---|---|")
        rows = record["presets"][p.name] = []
        for label, seed, cfg in p.configs:
            run_dir = args.runs_dir / cfg.name
            if not (run_dir / "metrics.jsonl").exists():
                print(f"| {label} | {seed} | not run | | | | |")
                continue
            curve, seconds = curve_of(run_dir)
            last = curve[-1] if curve else (0, None)
            gain = late_gain(curve, last[0]) if curve else None
            plateau = plateau_round(curve, args.threshold)
            rows.append({"label": label, "seed": seed, "run": cfg.name, "curve": curve, "train_seconds": seconds,
                         "last_round": last[0], "late_gain": gain, "plateau_round": plateau})
            cells = [label, seed, last[0], "-" if last[1] is None else f"{100 * last[1]:.2f}",
                     "-" if gain is None else f"{100 * gain:+.2f}",
                     plateau if plateau is not None else f"not by {last[0]}", f"{seconds:.0f}"]
            print("| " + " | ".join(map(str, cells)) + " |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
