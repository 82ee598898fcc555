"""What FedDF's server distillation did in each run: per level, the steps early stopping allowed, the validation KL
before and after, and its share of a round's time (the ``server`` field each round's line of metrics.jsonl holds,
``FedDF.server_log``).

    .venv/bin/python scripts/feddf_distillation.py RUN_DIR [RUN_DIR ...]

Medians over the rounds that logged it (rounds run on older code did not). Used in ``scalefl-table3``'s diagnosis.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

from hetfl.report import format_table


def distillation_rounds(run_dir: Path) -> list[tuple[float, dict]]:
    """(round seconds, {level: that level's distillation}) of each round that logged its distillation."""
    rounds = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if (server := record.get("server")) and "distillation" in server:
            rounds.append((record["seconds"], server["distillation"]))
    return rounds


def summary(run_dir: Path) -> list[list[str]]:
    """One row per level: run, level, rounds logged, median steps and best step, median validation KL before and
    after, and the median seconds of its distillation; then the run's median share of a round in distillation."""
    rounds = distillation_rounds(run_dir)
    if not rounds:
        return [[run_dir.name, "-", "0", "-", "-", "-", "-", "-"]]
    rows = []
    for level in sorted(rounds[0][1], key=int):
        logs = [levels[level] for _, levels in rounds if level in levels]
        rows.append([run_dir.name, level, str(len(logs)), f"{median(d['steps'] for d in logs):g}",
                     f"{median(d['best_step'] for d in logs):g}", f"{median(d['val_kl_before'] for d in logs):.4f}",
                     f"{median(d['val_kl_after'] for d in logs):.4f}", f"{median(d['seconds'] for d in logs):.1f}"])
    share = median(sum(d["seconds"] for d in levels.values()) / seconds for seconds, levels in rounds)
    rows.append([run_dir.name, "all", str(len(rounds)), "-", "-", "-", "-", f"{100 * share:.0f}% of a round"])
    return rows


def main(argv: list[str]) -> int:
    if not argv or any(not (Path(a) / "metrics.jsonl").is_file() for a in argv):
        print("usage: feddf_distillation.py RUN_DIR [RUN_DIR ...] (run folders holding a metrics.jsonl)",
              file=sys.stderr)
        return 2
    header = ["run", "level", "rounds", "steps", "best step", "val KL before", "val KL after", "seconds"]
    print(format_table(header, [row for run in argv for row in summary(Path(run))], markdown=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
