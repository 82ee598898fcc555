"""A ServerApp's side of a round on Flower's public ``Grid`` API: push every message at once, pull the replies
with a short poll (torch-free: hetfl's ServerApp and the floor's both use it).

``Grid.send_and_receive`` waits 3 s between pulls (flwr 1.41, superlink/grid/http_grid.py): a round
whose replies land a moment after a pull would wait for the next one. ``exchange`` pulls every
``POLL_SECONDS`` instead, through ``push_messages``/``pull_messages`` only (no patch of Flower). Each reply's
arrival goes to ``timing.EXCHANGE_LOG`` when the environment names one (``hetfl bench flower``).
"""

from __future__ import annotations

import time

from flwr.serverapp import Grid

from .timing import log_arrival

POLL_SECONDS = 0.1  # between pulls of replies


def exchange(grid: Grid, messages: dict, timeout: float) -> dict:
    """The replies to ``messages`` (key -> Message) that arrive within ``timeout`` seconds, by the same keys."""
    keys = list(messages)
    pushed = time.time()
    ids = grid.push_messages([messages[k] for k in keys])
    pending = {mid: key for key, mid in zip(keys, ids) if mid}  # None: a message that could not be pushed
    replies = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            key = pending.pop(reply.metadata.reply_to_message_id, None)
            if key is not None:
                replies[key] = reply
                log_arrival(reply.metadata.reply_to_message_id, pushed)
        if pending:
            time.sleep(POLL_SECONDS)
    return replies
