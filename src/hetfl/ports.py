"""Free TCP ports on the loopback for the processes hetfl starts (a Flower federation, a multi-process run).

A port is picked here and bound later by another process, so something else may take it in between.
The kernel gives the local end of every outgoing connection a port from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 on Linux), and a federation makes many such
connections (each SuperNode and ClientApp to the SuperLink): a port asked of the kernel with ``bind(0)``
comes from that same range, and one SuperNode's HTTP port was taken by another's connection before it
bound it (it then failed at every restart on that port). So ports are drawn from below that range, where
the kernel never hands out a port unasked, and never twice by one process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above the ports services are registered on
TRIES = 100

_handed_out: set[int] = set()  # by this process: two picks before either is bound must differ
_draw = random.Random()  # its own generator: picking a port never moves a seeded global stream


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, below the kernel's ephemeral range when that range leaves room
    (else one the kernel picks), never one this process has handed out before."""
    below = ephemeral_low()
    for _ in range(TRIES if below - LOWEST > TRIES else 0):
        port = _draw.randrange(LOWEST, below)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (32768, the usual one, where the kernel does not say)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    """Whether a TCP socket can bind 127.0.0.1:``port`` now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
