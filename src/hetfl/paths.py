"""Where hetfl keeps what it downloads and caches (torch-free: a Flower node's shim reads it too)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder for downloads and caches: $HETFL_CACHE, else ~/.cache/hetfl."""
    return Path(os.environ.get("HETFL_CACHE") or Path.home() / ".cache" / "hetfl").expanduser()
