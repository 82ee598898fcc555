"""Run-folder mechanics that survive kills, races and bad data.

* Every file a run writes whole (config.json, summary.json, final_model.pt, checkpoints) goes
  to a temporary name first and is renamed into place, so a reader sees the old file or the new
  one, never half of one. No fsync: the threat is a killed process, whose written pages the OS
  still flushes; a power cut is out of scope.
* metrics.jsonl is appended to; a kill can leave a partial last line, which readers drop.
* A run folder is created whole (config.json inside) by renaming a temporary folder, and locked
  (``flock`` on ``.lock``) by the process writing it for as long as it lives; the OS releases
  the lock when the process dies, so a second writer is refused and a crash never needs an unlock.
* ``HETFL_CRASH_AT=POINT[:N]`` makes the process SIGKILL itself the N-th time (default 1st) it
  passes ``crash_point(POINT)``: tests and the chaos bench kill it at chosen moments with it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import torch

from .errors import HetflError, warn

LOCK_NAME = ".lock"

_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Returns None; SIGKILLs this process here when HETFL_CRASH_AT names this point (and count)."""
    wanted = os.environ.get("HETFL_CRASH_AT")
    if not wanted:
        return
    point, _, nth = wanted.rpartition(":")
    if not nth.isdigit():  # no count given (point names hold colons too)
        point, nth = wanted, "1"
    if point != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


# ---- atomic writes ------------------------------------------------------------------------
_writes = itertools.count()


def write_then_rename(path: Path, write) -> None:
    """Returns None; ``write(tmp)`` to a temporary file next to ``path``, then renames it onto ``path``. The
    temporary name is this write's own (process, thread, count): bench processes that finish together all
    write the same summaries.json, and a shared name let one rename the file another was still writing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_writes)}.tmp")
    try:
        write(tmp)
        crash_point(f"write:{path.name}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temporary file behind


def atomic_write_text(path: Path, text: str) -> None:
    """Returns None; writes ``text`` to ``path`` through a temporary file and a rename."""
    write_then_rename(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: Path, obj) -> None:
    """Returns None; writes ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def atomic_torch_save(obj, path: Path) -> None:
    """Returns None; ``torch.save``s ``obj`` to ``path`` through a temporary file and a rename."""
    write_then_rename(path, lambda tmp: torch.save(obj, tmp))


def readable_torch_file(path: Path) -> bool:
    """Whether ``path`` is a complete torch file (a truncated one has lost its zip directory)."""
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torch raises many types for a damaged file
        return False
    return True


def readable_json_file(path: Path) -> bool:
    """Whether ``path`` holds one complete JSON document."""
    try:
        json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return True


def remove_temporary_files(folder: Path) -> None:
    """Returns None; deletes the temporary files of atomic writes that a kill left in ``folder`` (call it holding
    the folder's lock: no other writer can be using them)."""
    for tmp in Path(folder).glob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)


def remove_tree(path: Path) -> None:
    """Returns None; deletes the folder ``path`` if it exists (what a kill left half-deleted too)."""
    if Path(path).exists():
        shutil.rmtree(path)


# ---- metrics.jsonl ------------------------------------------------------------------------
def append_jsonl(path: Path, record: dict) -> None:
    """Returns None; appends ``record`` as one line (one write call, so a kill leaves at most one partial line)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: Path) -> tuple[list[dict], bool]:
    """The records of a JSON-lines file and whether a partial last line (a kill mid-append) was dropped.

    A bad line before the last one is corruption, not a kill: HetflError.
    """
    path = Path(path)
    if not path.exists():
        return [], False
    try:
        lines = path.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise HetflError(f"cannot read {path}: {e}") from None
    records, partial = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # no newline after it: the line being written when killed
                partial = True
                continue
            raise HetflError(f"{path} line {i + 1} is not valid JSON; the file is corrupt") from None
    return records, partial


def check_rounds(records: list, path: Path) -> None:
    """Returns None; raises HetflError unless every record of a metrics file is a table with a round number."""
    for i, record in enumerate(records):
        if not isinstance(record, dict) or type(record.get("round")) is not int or record["round"] < 1:
            raise HetflError(f"{path} line {i + 1} is not a round's record (a JSON object with a round >= 1); "
                             "the file is corrupt")


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Returns None; replaces a JSON-lines file with ``records`` atomically."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


# ---- names and folders --------------------------------------------------------------------
NAME_MAX = 255  # a file name's bytes on Linux, macOS and Windows file systems; os.pathconf says where it can
PATH_MAX = 4096
INNER_PATH = 64  # the longest path a run folder holds below itself (a checkpoint's temporary files), with margin
_CREATING = len(".") + len(".xxxxxxxx.creating")  # create_run_dir's temporary name around the folder's name


def nearest_existing(path: Path) -> Path:
    """``path``, or the nearest of its parents that exists (a name too long for the file system does not)."""
    def exists(folder: Path) -> bool:
        try:
            return folder.exists()
        except OSError:  # ENAMETOOLONG, which pathlib raises instead of answering False
            return False

    return next(folder for folder in (path, *path.parents) if exists(folder))


def existing_folder_above(path: str | Path, what: str) -> Path:
    """The nearest existing folder of ``path`` (itself or a parent), where ``path``'s folders would be created;
    HetflError naming ``what`` when that is a file."""
    existing = nearest_existing(Path(path).absolute())
    if not existing.is_dir():
        raise HetflError(f"{what} {str(path)!r} cannot hold folders: {existing} is a file, not a folder")
    return existing


def check_location(out: str, name: str) -> None:
    """Returns None; raises HetflError unless ``name`` (the run folder's name: given, or what one would be generated
    as) is one path component that fits the file system, and ``out`` can hold folders of that name."""
    if name and (name in (".", "..") or "/" in name or "\0" in name or (os.altsep and os.altsep in name)):
        raise HetflError(f"name {name!r} must be a single folder name (no '/', not '.' or '..'); "
                         "use --out to choose where run folders go")
    if not out:
        raise HetflError("out must name a folder, got an empty string")
    existing = existing_folder_above(out, "out")
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = NAME_MAX
    too_long = [part for part in Path(out).parts if len(os.fsencode(part)) > name_max]
    if too_long:
        raise HetflError(f"out {out!r}: folder name {too_long[0][:40]}... is longer than the file system's "
                         f"{name_max} bytes")
    if len(os.fsencode(name)) + _CREATING > name_max:
        raise HetflError(f"name {name[:40]}... is {len(os.fsencode(name))} bytes; a run folder's name must be at most "
                         f"{name_max - _CREATING} (the file system's limit, {name_max}, less a temporary suffix); "
                         "choose a shorter --name")
    length = len(os.fsencode(str(Path(out).absolute() / name))) + INNER_PATH
    if length > PATH_MAX:
        raise HetflError(f"out {out!r} with name {name[:40]}... makes paths of {length} bytes, over the {PATH_MAX} "
                         "a path may have; choose a shorter --out or --name")


def check_writable_folder(folder: Path, what: str) -> None:
    """Returns None; raises HetflError naming ``what`` unless a file can be created in ``folder``. Tried by creating
    and removing one: ``os.access`` says yes to root where a write still fails (/proc, a read-only mount)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".hetfl-write-check-", dir=folder)
    except OSError as e:
        raise HetflError(f"{what}: cannot write in folder {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_folder(path: str | Path, what: str) -> None:
    """Returns None; raises HetflError naming ``what`` unless ``path`` is a folder hetfl can write in or can be
    created as one (its nearest existing parent is a writable folder). Check it before the work that fills it."""
    check_writable_folder(existing_folder_above(path, what), f"{what} {path}")


def create_run_dir(run_dir: Path, files: dict[str, str]) -> Path:
    """``run_dir`` created whole, holding ``files`` (name -> text) and locked by this process.

    The folder is built under a temporary name and renamed, so a kill leaves either no run folder
    or one with its config, never an empty one that neither a new run nor a resume accepts.
    """
    run_dir = Path(run_dir)
    if run_dir.exists():
        raise HetflError(f"run folder {run_dir} already exists; choose another --name or --resume it")
    first_new = nearest_existing(run_dir.parent.absolute())
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_creations(run_dir.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", suffix=".creating", dir=run_dir.parent))
    except OSError as e:
        _remove_empty_folders(run_dir.parent.absolute(), first_new)  # a refused run leaves no empty runs/ behind
        raise HetflError(f"cannot create run folder {run_dir}: {e.strerror}") from None
    fd = _lock_file(tmp)  # the lock follows the file through the rename
    for name, text in files.items():
        (tmp / name).write_text(text)
    crash_point("run-dir-created")
    try:
        os.rename(tmp, run_dir)  # fails on an existing non-empty folder: another process won the name
    except OSError:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise HetflError(f"run folder {run_dir} already exists; choose another --name or --resume it") from None
    _HELD[_key(run_dir)] = fd
    return run_dir


def _remove_empty_folders(folder: Path, keep: Path) -> None:
    """Returns None; removes ``folder`` and its parents up to ``keep`` (excluded) while they are empty."""
    while folder != keep and keep in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


STALE_SECONDS = 60  # a folder being created lives for milliseconds; one this old whose lock is free was abandoned


def _remove_abandoned_creations(parent: Path) -> None:
    """Returns None; deletes the temporary folders of run folders whose creator was killed before the rename (no
    process holds their lock, and they are older than ``STALE_SECONDS``)."""
    for folder in parent.glob(".*.creating"):
        try:
            if time.time() - folder.stat().st_mtime < STALE_SECONDS:
                continue
            fd = os.open(folder / LOCK_NAME, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its creator lives
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


# ---- the lock -----------------------------------------------------------------------------
_HELD: dict[str, int] = {}  # resolved run folder -> fd of its locked .lock file, held by this process


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def _lock_file(folder: Path) -> int:
    """The fd of ``folder/.lock`` locked exclusively by this process; HetflError if another holds it."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise HetflError(f"cannot lock {folder / LOCK_NAME}: {e.strerror}; it must be a file hetfl can write "
                         f"(delete it if no hetfl process uses {folder})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(f"run folder {folder} is in use by another hetfl process (pid {holder}); "
                         "wait for it to end or stop it, then --resume") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the error message of a refused writer
    return fd


class RunDirBusy(HetflError):
    """Another live process holds the run folder's lock."""


def lock_run_dir(run_dir: Path) -> None:
    """Returns None; locks ``run_dir`` for this process until it ends or ``unlock_run_dir``.

    Locking a folder this process already holds is a no-op: flock locks belong to an open file,
    so a second open in the same process would refuse the process itself.
    """
    key = _key(run_dir)
    if key not in _HELD:
        _HELD[key] = _lock_file(Path(run_dir))


def unlock_run_dir(run_dir: Path) -> None:
    """Returns None; releases this process's lock of ``run_dir``, if it holds one."""
    fd = _HELD.pop(_key(run_dir), None)
    if fd is not None:
        os.close(fd)


def warn_partial_line(path: Path, what: str) -> None:
    """Returns None; warns that the partial last line of ``path`` was dropped (``what``: what follows)."""
    warn(f"{path}: dropped a partial last line (a run killed while writing it); {what}")
