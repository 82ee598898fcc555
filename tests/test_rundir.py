"""Run-folder mechanics: JSON lines that survive a kill mid-append, checkpoint recovery, the folder lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from hetfl.checkpoint import has_checkpoint, recover_checkpoint
from hetfl.errors import HetflError
from hetfl.rundir import (append_jsonl, atomic_write_json, atomic_write_text, check_location, create_run_dir,
                          lock_run_dir, read_jsonl, unlock_run_dir, write_jsonl, write_then_rename)


def test_jsonl_drops_only_a_partial_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    assert read_jsonl(path) == ([], False)
    for r in range(3):
        append_jsonl(path, {"round": r})
    assert read_jsonl(path) == ([{"round": 0}, {"round": 1}, {"round": 2}], False)
    path.write_text(path.read_text() + '{"round": 3, "lo')
    assert read_jsonl(path) == ([{"round": 0}, {"round": 1}, {"round": 2}], True)
    path.write_text('{"round": 0}\n{"rou\n{"round": 2}\n')
    with pytest.raises(HetflError, match="line 2 is not valid JSON"):
        read_jsonl(path)


def test_atomic_writes_leave_no_temporary_file(tmp_path):
    write_jsonl(tmp_path / "m.jsonl", [{"a": 1}])
    atomic_write_json(tmp_path / "s.json", {"b": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "s.json"]


def test_atomic_writes_of_one_file_do_not_collide(tmp_path):
    """Bench processes that finish together all write summaries.json: a write that starts while another is
    between its write and its rename (nested here, so the interleaving is certain) must not take its file."""
    path = tmp_path / "summaries.json"

    def write_while_another_writes(tmp):
        tmp.write_text("outer\n")
        atomic_write_text(path, "inner\n")  # written and renamed before the outer write's rename

    write_then_rename(path, write_while_another_writes)
    assert path.read_text() == "outer\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summaries.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "s.json"
    atomic_write_text(path, "old\n")

    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_then_rename(path, fail)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_check_location(tmp_path):
    check_location(str(tmp_path / "new" / "runs"), "run-1")
    check_location(str(tmp_path), "")
    (tmp_path / "f").write_text("")
    with pytest.raises(HetflError, match="is a file, not a folder"):
        check_location(str(tmp_path / "f" / "runs"), "r")
    for bad in ("..", "a/b", "../x"):
        with pytest.raises(HetflError, match="single folder name"):
            check_location(str(tmp_path), bad)


def checkpoint(folder, round_index):
    (folder / "client_state").mkdir(parents=True)
    torch.save({"round": round_index}, folder / "state.pt")


@pytest.mark.parametrize("present,expected_round", [
    ({"checkpoint": 2, "checkpoint.tmp": 3}, 2),         # killed writing checkpoint.tmp
    ({"checkpoint.old": 2, "checkpoint.tmp": 3}, 2),     # killed between the two renames
    ({"checkpoint": 3, "checkpoint.old": 2}, 3),         # killed before or while deleting checkpoint.old
    ({"checkpoint.tmp": 1}, None),                       # killed writing the first one
])
def test_recover_checkpoint_leaves_one_complete_checkpoint(tmp_path, present, expected_round):
    for name, r in present.items():
        checkpoint(tmp_path / name, r)
    if "checkpoint.old" in present and "checkpoint" in present:
        (tmp_path / "checkpoint.old" / "state.pt").unlink()  # half deleted
    recover_checkpoint(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    if expected_round is None:
        assert left == [] and not has_checkpoint(tmp_path)
    else:
        assert left == ["checkpoint"]
        assert torch.load(tmp_path / "checkpoint" / "state.pt")["round"] == expected_round


LOCK_IN_CHILD = ("import sys; from hetfl.rundir import lock_run_dir; from hetfl.errors import HetflError\n"
                 "try: lock_run_dir(sys.argv[1])\n"
                 "except HetflError as e: print(e); sys.exit(2)")


def test_lock_refuses_another_process_and_not_this_one(tmp_path):
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # this process again: a no-op
    child = subprocess.run([sys.executable, "-c", LOCK_IN_CHILD, str(tmp_path)], capture_output=True, text=True)
    assert child.returncode == 2 and "in use by another hetfl process" in child.stdout
    unlock_run_dir(tmp_path)
    child = subprocess.run([sys.executable, "-c", LOCK_IN_CHILD, str(tmp_path)], capture_output=True, text=True)
    assert child.returncode == 0, child.stdout + child.stderr


def test_only_abandoned_creations_are_removed(tmp_path):
    """A creation folder is removed by the next run folder created beside it only when it is older than
    STALE_SECONDS and no process holds its lock (its creator was killed)."""
    import fcntl

    from hetfl.rundir import STALE_SECONDS, unlock_run_dir

    old = time.time() - STALE_SECONDS - 1
    folders = {}
    for name in ("abandoned", "recent", "held"):
        folders[name] = tmp_path / f".{name}.x.creating"
        folders[name].mkdir()
        (folders[name] / ".lock").write_text("")
        if name != "recent":
            os.utime(folders[name], (old, old))
    with open(folders["held"] / ".lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live creator (this test) holds it
        create_run_dir(tmp_path / "new", {"config.json": "{}"})
    unlock_run_dir(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".held.x.creating", ".recent.x.creating", "new"]
