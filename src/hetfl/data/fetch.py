"""Downloading Fashion-MNIST into the cache, verified before it is put in place."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import HetflError
from .datasets import FMNIST_SHA256, fmnist_cache_dir
from .idx import check_sha256, find_file, read_bytes

# The official files (zalandoresearch/fashion-mnist README). S3 website endpoints serve plain http
# only; integrity comes from the sha256 check, not the transport.
FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
TIMEOUT_S = 60


def fetch_fmnist(dest: str | None = None, base_url: str = FMNIST_URL) -> Path:
    """The folder (``dest``, default the cache) holding the four verified Fashion-MNIST files; fetches missing ones."""
    folder = Path(dest).expanduser() if dest else fmnist_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HetflError(f"cannot create the download folder {folder}: {e.strerror or e}") from None
    for name, sha256 in FMNIST_SHA256.items():
        if not _is_valid(folder, name, sha256):
            _download(f"{base_url.rstrip('/')}/{name}.gz", folder / f"{name}.gz", sha256)
    return folder


def _is_valid(folder: Path, name: str, sha256: str) -> bool:
    """Whether the file the loader would read for ``name`` exists and has the right content."""
    path = find_file(folder, name)
    try:
        return path is not None and hashlib.sha256(read_bytes(path)).hexdigest() == sha256
    except HetflError:  # unreadable or a broken gzip: download it again
        return False


def _download(url: str, target: Path, sha256: str) -> None:
    """Returns None once ``url`` is saved as ``target``, gunzipped content checked; leaves nothing on failure."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".gz")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                    shutil.copyfileobj(response, out)
            except (urllib.error.URLError, OSError) as e:  # also timeouts and HTTP errors
                raise HetflError(f"download of {url} failed ({getattr(e, 'reason', e)}); pass --data-dir DIR with the "
                                 f"files or install the Debian package dataset-fashion-mnist") from None
        check_sha256(url, read_bytes(Path(tmp)), sha256)
        os.replace(tmp, target)  # atomic: the loader never sees a partial file
    finally:
        Path(tmp).unlink(missing_ok=True)
