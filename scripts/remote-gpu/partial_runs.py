"""The runs a time budget cut short on a remote machine, brought back from their last checkpoint (remote.sh).

A remote machine rented for a short time may be fresh at each call and gone after it, so a run the budget stopped
would lose every round it had trained. ``pack`` writes the unfinished runs that hold a checkpoint into
``partial-runs.tar.NN`` files within what a call brings back (by default at most 8 files of 16 MiB, 64 MiB
together, counting the files already there: ``MAX_FILES``, ``MAX_FILE``, ``MAX_TOTAL``), the runs that saved the
most seconds per byte first; ``unpack`` puts them into a local runs folder, where ``hetfl bench suite`` resumes
each from its checkpoint on the device asked then (``Simulation.resume``'s ``device``: the device is no part of a
run, so a run a GPU began goes on on a CPU, and its summary's ``segments`` say which rounds ran where).

    python3 scripts/remote-gpu/partial_runs.py pack RUNS_DIR OUT --skip-unmoved  (there, after the suite)
    python3 scripts/remote-gpu/partial_runs.py unpack FOLDER RUNS_DIR   (here: `remote.sh collect` calls it)

``unpack`` never replaces a run that is finished here, that has a checkpoint as far along here, or that a process
here is training (its bench lock, ``runner.run_lock``, is held).

The other way, ``scripts/remote-gpu/remote.sh stage`` sends the runs begun here to the remote machine, which
finishes the ones it can: ``pack runs/bench .remote-gpu --room 20 --skip-saved docs/results`` (room for
Fashion-MNIST and the working tree in the same transfer; a run a committed table holds already is not sent).
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from hetfl.bench.runner import saved_runs
from hetfl.bench.suite import checkpoint_of

MAX_FILES, MAX_FILE, MAX_TOTAL = 8, 16 * 2**20, 64 * 2**20  # what one call brings back from the remote $OUT
MARGIN = 2**20  # tar's headers and padding, and the suite's own files written after the count
PREFIX = "partial-runs.tar."
PLACED = ".placed.json"  # in a runs folder: the rounds at which unpack placed its runs (pack skips the unmoved)


def checkpoint_round(run_dir: Path) -> int:
    """The round of the run folder's last checkpoint (0: none, or unreadable)."""
    return checkpoint_of(run_dir)[0]


def saved_seconds(run_dir: Path, upto: int) -> float:
    """The seconds the run's logged rounds up to ``upto`` took: what its checkpoint saves."""
    try:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return 0.0
    return sum(r.get("seconds") or 0.0 for r in rows if isinstance(r, dict) and r.get("round", upto + 1) <= upto)


def size(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())


def partial_runs(runs_dir: Path) -> list[tuple[Path, int]]:
    """The run folders of ``runs_dir`` with a checkpoint and no summary: (folder, checkpoint round)."""
    runs = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (run_dir / "summary.json").exists() and (done := checkpoint_round(run_dir)):
            runs.append((run_dir, done))
    return runs


def pack(runs_dir: Path, out: Path, max_files: int = MAX_FILES, max_file: int = MAX_FILE,
         max_total: int = MAX_TOTAL, margin: int = MARGIN, skip: frozenset[str] = frozenset(),
         skip_unmoved: bool = False) -> list[str]:
    """Write the partial runs of ``runs_dir`` (but those named in ``skip`` and, with ``skip_unmoved``, those still at
    the checkpoint ``unpack`` placed them at) that fit into ``out`` as ``partial-runs.tar.NN`` parts; returns the
    names of the runs packed."""
    for old in out.glob(PREFIX + "*"):  # an earlier pack's: replaced
        old.unlink()
    present = [f for f in out.iterdir() if f.is_file()]
    room = min((max_files - len(present)) * max_file, max_total - sum(f.stat().st_size for f in present)) - margin
    chosen, used = [], 0
    placed = json.loads((runs_dir / PLACED).read_text()) if skip_unmoved and (runs_dir / PLACED).exists() else {}
    runs = [(run_dir, saved_seconds(run_dir, done), size(run_dir)) for run_dir, done in partial_runs(runs_dir)
            if run_dir.name not in skip and placed.get(run_dir.name) != done]  # nothing new: stays
    for run_dir, seconds, nbytes in sorted(runs, key=lambda r: -r[1] / max(r[2], 1)):
        if used + nbytes <= room:
            chosen.append(run_dir)
            used += nbytes
    if not chosen:
        return []
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for run_dir in chosen:
            tar.add(run_dir, arcname=run_dir.name, filter=lambda m: None if m.name.endswith(".lock") else m)
    data = stream.getvalue()
    for i in range(0, len(data), max_file):
        (out / f"{PREFIX}{i // max_file:02d}").write_bytes(data[i:i + max_file])
    return [run_dir.name for run_dir in chosen]


def _bench_lock_is_free(runs_dir: Path, name: str) -> bool:
    """Whether no process here holds the bench lock of run folder ``name`` (METHOD-KEY-sSEED: lock KEY-sSEED)."""
    lock = runs_dir / ".locks" / "-".join(name.split("-")[-2:])
    if not lock.exists():
        return True
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def unpack(folder: Path, runs_dir: Path) -> list[str]:
    """Put the runs of ``folder``'s ``partial-runs.tar.NN`` parts into ``runs_dir``, each unless it is finished, as
    far along or being trained here; returns a line per run saying what was done."""
    parts = sorted(folder.glob(PREFIX + "*"))
    if not parts:
        return []
    runs_dir.mkdir(parents=True, exist_ok=True)
    said, placed = [], {}
    with tempfile.TemporaryDirectory(dir=runs_dir, prefix=".unpacking-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        for run in sorted(Path(tmp).iterdir()):
            here, came = runs_dir / run.name, checkpoint_round(run)
            if (here / "summary.json").exists():
                said.append(f"{run.name}: finished here already; kept")
            elif (ahead := checkpoint_round(here)) >= came:
                said.append(f"{run.name}: here at round {ahead}, the remote copy's at {came}; kept")
            elif not _bench_lock_is_free(runs_dir, run.name):
                said.append(f"{run.name}: a process here is training it; kept")
            else:
                shutil.rmtree(here, ignore_errors=True)
                run.rename(here)
                placed[run.name] = came
                said.append(f"{run.name}: checkpoint of round {came} in place; a suite resumes it")
    path = runs_dir / PLACED
    earlier = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**earlier, **placed}))
    return said


def saved_in(results: Path) -> frozenset[str]:
    """The run folder names the committed tables under ``results`` hold (``runner.saved_runs``)."""
    return frozenset(name for folder in results.iterdir() if folder.is_dir() for name in saved_runs(folder))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="partial_runs.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="the runs of RUNS_DIR cut short, into OUT")
    packing.add_argument("runs_dir", type=Path)
    packing.add_argument("out", type=Path)
    packing.add_argument("--room", type=float, help="MiB at most (default: what a call brings back)")
    packing.add_argument("--skip-saved", type=Path, metavar="RESULTS", help="leave out the runs its tables hold")
    packing.add_argument("--skip-unmoved", action="store_true",
                         help="leave out the runs still where unpack placed them (the way back)")
    unpacking = verbs.add_parser("unpack", help="the runs of FOLDER's parts, into RUNS_DIR")
    unpacking.add_argument("folder", type=Path)
    unpacking.add_argument("runs_dir", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "unpack":
        for line in unpack(args.folder, args.runs_dir):
            print(f"partial_runs: {line}")
        return 0
    if not args.runs_dir.is_dir():
        print(f"partial_runs: no runs folder {args.runs_dir}: nothing to pack")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    names = pack(args.runs_dir, args.out, max_total=int(args.room * 2**20) if args.room else MAX_TOTAL,
                 skip=saved_in(args.skip_saved) if args.skip_saved else frozenset(), skip_unmoved=args.skip_unmoved)
    print(f"partial_runs: {len(names)} runs cut short packed into {args.out}: {', '.join(names)}" if names
          else "partial_runs: no run cut short with a checkpoint to pack")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
