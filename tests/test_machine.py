"""The machine's load around a measurement: ``machine.OthersBusy``."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hetfl import machine


def test_busy_seconds_are_the_non_idle_ticks_of_the_first_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice: idle and iowait are not busy
    stat.write_text("cpu  100 5 20 1000 7 1 2 3 0 0\ncpu0 50 0 10 500 3 1 1 2 0 0\n")
    assert machine._machine_busy_seconds(stat) == pytest.approx(131 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("intr 1 2 3\n")
    assert machine._machine_busy_seconds(stat) is None
    assert machine._machine_busy_seconds(tmp_path / "absent") is None


def test_others_busy_is_the_machines_busy_time_less_this_processes_over_the_wall_time(monkeypatch):
    busy, own, wall = iter([100.0, 103.5]), iter([10.0, 11.0]), iter([50.0, 52.0])
    monkeypatch.setattr(machine, "_machine_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(machine, "time", types.SimpleNamespace(process_time=lambda: next(own),
                                                               perf_counter=lambda: next(wall)))
    with machine.OthersBusy() as others:
        pass
    assert others.cores == pytest.approx((3.5 - 1.0) / 2.0)  # this process's own second is not the others'


def test_others_busy_is_none_where_the_machine_says_nothing(monkeypatch):
    monkeypatch.setattr(machine, "_machine_busy_seconds", lambda: None)
    with machine.OthersBusy() as others:
        pass
    assert others.cores is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="/proc/stat is Linux's")
def test_a_process_spinning_beside_the_block_counts_as_about_a_core():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        with machine.OthersBusy() as others:
            spin.wait()
    finally:
        spin.kill()
    assert others.cores >= 0.6  # the child's interpreter start-up is in the window too
