"""Ports for the processes hetfl starts: free, below the kernel's ephemeral range, never handed out twice."""

from __future__ import annotations

import socket

from hetfl import ports


def test_ports_are_free_below_the_ephemeral_range_and_never_handed_out_twice():
    got = [ports.free_port() for _ in range(300)]
    assert len(set(got)) == len(got)
    assert all(ports.LOWEST <= port < ports.ephemeral_low() for port in got)
    for port in got[:20]:  # free: a listener can take each
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy, free = taken.getsockname()[1], ports.free_port()
        draws = iter([busy, busy, free])
        monkeypatch.setattr(ports._draw, "randrange", lambda low, high: next(draws))
        monkeypatch.setattr(ports, "ephemeral_low", lambda: 65000)
        monkeypatch.setattr(ports, "_handed_out", set())
        assert ports.free_port() == free


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch, tmp_path):
    (tmp_path / "range").write_text("1024\t65000\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    assert ports.ephemeral_low() == 1024
    got = {ports.free_port() for _ in range(50)}
    assert len(got) == 50 and all(port >= 1024 for port in got)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "none")
    assert ports.ephemeral_low() == 32768
