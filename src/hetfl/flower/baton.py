"""Taking turns round by round: two Flower runs on one federation alternate their rounds (``hetfl bench flower``).

The bench compares hetfl's rounds with Flower's floor's on the same SuperLink and SuperNodes. Run one after
the other (three rounds of one, then three of the other), a machine whose speed drifts within minutes charges
the drift to whichever ran in the slower minutes; taking turns round by round, a slower minute hits both. The
two runs' ServerApps are live at once, and a baton, a file naming whose round comes next, decides which of them
runs a round: each waits until the baton names it, runs one round (its evaluation included) and hands the baton
to the other. Waiting happens between rounds, outside the rounds' timings. The bench sets ``BATON_ENV`` (the
file) for the processes of its federation; without it nothing waits. Standard library only: the floor's
ServerApp imports it and stays torch-free.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from ..errors import HetflError

BATON_ENV = "HETFL_BATON"  # the baton's file, set by the bench for the processes of its federation
FLOOR, HETFL = "floor", "hetfl"  # the two runs' names on the baton
POLL_SECONDS = 0.02  # between looks at the baton: a handover costs at most this, outside either run's rounds


class Baton:
    """A file naming whose round comes next."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def from_env(cls) -> Baton | None:
        """The baton ``BATON_ENV`` names, or None when no bench has set one."""
        path = os.environ.get(BATON_ENV)
        return cls(path) if path else None

    def holder(self) -> str:
        """Who holds the baton now ('' before anyone has)."""
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return ""

    def give(self, to: str) -> None:
        """Returns None; hands the baton to ``to`` (written whole: a reader never sees half a name)."""
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        part.write_text(to)
        os.replace(part, self.path)

    def wait_for(self, me: str, timeout: float) -> None:
        """Returns None once the baton names ``me``; HetflError after ``timeout`` seconds (the other run failed)."""
        deadline = time.monotonic() + timeout
        while self.holder() != me:
            if time.monotonic() > deadline:
                raise HetflError(f"the baton {self.path} did not come back to {me} within {timeout:g} s "
                                 f"(held by {self.holder() or 'no one'})")
            time.sleep(POLL_SECONDS)


def taking_turns(on_round: Callable, baton: Baton, me: str, other: str) -> Callable:
    """A Simulation's ``on_round`` that, after ``on_round``, hands ``baton`` to ``other`` and waits for it back
    before the next round; after the last round it keeps the baton (whoever started the run hands it on)."""
    def after_round(sim, record: dict) -> None:
        on_round(sim, record)
        if record["round"] < sim.cfg.rounds:
            baton.give(other)
            baton.wait_for(me, sim.cfg.round_timeout)
    return after_round
