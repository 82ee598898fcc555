"""Downloading standard datasets into the cache, verified before they are put in place.

`hetfl data fetch NAME`: fmnist (four .gz files, checked by the sha256 of their content), and the sources in
SOURCES: mnist (four .gz files), emnist (the balanced split's four files out of NIST's gzip.zip), cifar10 and
cifar100 (the python tarballs), each checked by the md5 its publisher gives (torchvision checks the same).

Every download goes to a temporary file beside its destination and is checked before anything is renamed
into place, so a failed or interrupted fetch leaves no half-written file where the loader looks. From an
archive only the members named in its Source are read, each written under a name chosen here: a member's
own path is never used (no traversal) and a link is refused. Tests point SOURCES' base URLs at a local server.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HetflError
from .datasets import EMNIST_SPLIT, FMNIST_SHA256, IDX_FILES, _emnist_files, dataset_cache_dir, fmnist_cache_dir
from .idx import check_sha256, find_file, read_bytes

# The official files (zalandoresearch/fashion-mnist README). S3 website endpoints serve plain http
# only; integrity comes from the sha256 check, not the transport.
FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
TIMEOUT_S = 60
MANIFEST = ".hetfl-fetch.json"  # beside files extracted from an archive: the archive's md5 and each file's sha256
CHUNK = 1 << 20


@dataclass(frozen=True)
class Source:
    """Where `fetch_dataset` gets one dataset: files under ``base_url``, each with its published md5, and for an
    archive the members the loader reads."""

    title: str  # for messages: "CIFAR-10"
    base_url: str
    md5: Mapping[str, str]  # file name under base_url -> md5 of that file
    members: Mapping[str, str] = field(default_factory=dict)  # archive member -> its name in the folder; {}: no archive

    def checksums(self) -> str:
        """The checksums a fetch verifies, for the CLI: "cifar-10-python.tar.gz, md5 c58f...", comma-separated."""
        return ", ".join(f"{name}, md5 {md5}" for name, md5 in self.md5.items())


def _members(folder: str, names: tuple[str, ...], suffix: str = "") -> dict[str, str]:
    """Archive member -> file name, for the files ``names`` (plus ``suffix``) under ``folder`` in the archive."""
    return {f"{folder}/{n}{suffix}": f"{n}{suffix}" for n in names}


# md5s as published by the datasets' sites and in torchvision's datasets/mnist.py, cifar.py. yann.lecun.com
# often refuses downloads now; torchvision's S3 mirror serves the same bytes.
SOURCES: dict[str, Source] = {
    "mnist": Source("MNIST", "https://ossci-datasets.s3.amazonaws.com/mnist/", {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
    "emnist": Source(f"EMNIST ({EMNIST_SPLIT})", "https://biometrics.nist.gov/cs_links/EMNIST/",
                     {"gzip.zip": "58c8d27c78d21e728a6bc7b3cc06412e"},
                     _members("gzip", _emnist_files(EMNIST_SPLIT), ".gz")),  # only the split the loader reads
    "cifar10": Source("CIFAR-10", "https://www.cs.toronto.edu/~kriz/",
                      {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
                      _members("cifar-10-batches-py", (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"))),
    "cifar100": Source("CIFAR-100", "https://www.cs.toronto.edu/~kriz/",
                       {"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"},
                       _members("cifar-100-python", ("train", "test"))),
}
FETCHABLE = ("fmnist", *SOURCES)


# ---------------------------------------------------------------- Fashion-MNIST


def fetch_fmnist(dest: str | None = None, base_url: str = FMNIST_URL) -> Path:
    """The folder (``dest``, default the cache) holding the four verified Fashion-MNIST files; fetches missing ones."""
    folder = _make_folder(Path(dest).expanduser() if dest else fmnist_cache_dir())
    for name, sha256 in FMNIST_SHA256.items():
        if not _is_valid(folder, name, sha256):
            url = f"{base_url.rstrip('/')}/{name}.gz"
            _download(url, folder / f"{name}.gz", lambda path: check_sha256(url, read_bytes(path), sha256),
                      "pass --data-dir DIR with the files or install the Debian package dataset-fashion-mnist")
    return folder


def _is_valid(folder: Path, name: str, sha256: str) -> bool:
    """Whether the file the loader would read for ``name`` exists and has the right content."""
    path = find_file(folder, name)
    try:
        return path is not None and hashlib.sha256(read_bytes(path)).hexdigest() == sha256
    except HetflError:  # unreadable or a broken gzip: download it again
        return False


# ---------------------------------------------------------------- MNIST, EMNIST, CIFAR-10, CIFAR-100


def fetch_dataset(name: str, dest: str | None = None) -> Path:
    """The folder (``dest``, default the cache) holding the verified files of dataset ``name`` (a key of
    SOURCES); downloads what is missing or does not match its checksum."""
    if name not in SOURCES:
        raise HetflError(f"cannot fetch dataset {name!r}; fetch_dataset knows {', '.join(SOURCES)}")
    source = SOURCES[name]
    folder = _make_folder(Path(dest).expanduser() if dest else dataset_cache_dir(name))
    hint = (f"download {', '.join(source.md5)} elsewhere{', unpack it' if source.members else ''} and pass --data-dir "
            f"DIR (or set HETFL_DATA_DIR) with the folder holding {'its files' if source.members else 'them'}")
    try:
        if not source.members:  # plain files, kept as downloaded
            for file, md5 in source.md5.items():
                if not (folder / file).is_file() or _md5(folder / file) != md5:
                    _download_checked(source, file, folder / file, hint)
        elif not _extracted_valid(folder, source):
            _fetch_archive(source, folder, hint)
    except OSError as e:  # writing: a full disk, a read-only folder (download errors are HetflErrors already)
        raise HetflError(f"cannot write {source.title} into {folder}: {e.strerror or e}") from None
    return folder


def _fetch_archive(source: Source, folder: Path, hint: str) -> None:
    """Returns None once the members of ``source``'s archive are in ``folder``, with a manifest; the archive is
    downloaded and unpacked in a temporary folder beside ``folder`` (same file system: the renames are atomic)
    and deleted after."""
    (archive, md5), = source.md5.items()
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.fetch-") as tmp:
        staged = Path(tmp)
        _download_checked(source, archive, staged / archive, hint)
        out = staged / "files"
        out.mkdir()
        _extract(staged / archive, source.members, out)
        files = {name: _sha256(out / name) for name in source.members.values()}
        (out / MANIFEST).write_text(json.dumps({"archive": archive, "md5": md5, "sha256": files}, indent=1))
        (folder / MANIFEST).unlink(missing_ok=True)  # until the new one lands, the folder counts as not fetched
        for name in (*files, MANIFEST):  # the manifest last: it vouches for files already in place
            os.replace(out / name, folder / name)


def _extracted_valid(folder: Path, source: Source) -> bool:
    """Whether ``folder`` holds the files extracted from ``source``'s archive, unchanged since (per the manifest)."""
    (archive, md5), = source.md5.items()
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["sha256"]
        return (manifest["archive"], manifest["md5"]) == (archive, md5) and \
            set(files) == set(source.members.values()) and all(_sha256(folder / n) == files[n] for n in files)
    except (OSError, ValueError, KeyError, TypeError):  # missing or damaged: fetch again
        return False


def _extract(archive: Path, members: Mapping[str, str], into: Path) -> None:
    """Returns None once each member of ``archive`` (a .zip or a tarball) named in ``members`` is a regular file
    in ``into`` under the name ``members`` gives; other members are not read."""
    found = set()
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    if info.filename in members:
                        if info.is_dir() or stat.S_ISLNK(info.external_attr >> 16):
                            raise HetflError(f"{archive.name}: member {info.filename} is not a regular file")
                        with zf.open(info) as src:
                            _write(src, into / members[info.filename])
                        found.add(info.filename)
        else:
            with tarfile.open(archive, "r|*") as tar:  # one pass over the stream
                for member in tar:
                    if member.name in members:
                        if not member.isfile():  # a link or a device would write elsewhere than named
                            raise HetflError(f"{archive.name}: member {member.name} is not a regular file")
                        _write(tar.extractfile(member), into / members[member.name])
                        found.add(member.name)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as e:
        raise HetflError(f"cannot unpack {archive.name}: {e}") from None
    missing = [m for m in members if m not in found]
    if missing:
        raise HetflError(f"{archive.name} lacks {', '.join(missing)}; it is not the expected release")


def _write(src, path: Path) -> None:
    """Returns None once the stream ``src`` is copied to the new file ``path``."""
    with open(path, "wb") as out:
        shutil.copyfileobj(src, out, CHUNK)


# ---------------------------------------------------------------- downloading and checking


def _download_checked(source: Source, file: str, target: Path, hint: str) -> None:
    """Returns None once ``file`` of ``source`` is saved as ``target``, its md5 checked."""
    url = source.base_url.rstrip("/") + "/" + file
    _download(url, target, lambda path: _check_md5(url, path, source.md5[file]), hint)


def _download(url: str, target: Path, verify: Callable[[Path], None], hint: str) -> None:
    """Returns None once ``url`` is saved as ``target`` after ``verify`` (which raises HetflError) accepted the
    downloaded file; leaves nothing on failure. ``hint``: what to do when the download fails."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=target.suffix)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                    shutil.copyfileobj(response, out, CHUNK)
            except (urllib.error.URLError, OSError) as e:  # also timeouts and HTTP errors
                reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)  # HTTP: the status too
                raise HetflError(f"download of {url} failed ({reason}); {hint}") from None
        verify(Path(tmp))
        os.replace(tmp, target)  # atomic: the loader never sees a partial file
    finally:
        Path(tmp).unlink(missing_ok=True)


def _check_md5(label: str, path: Path, expected: str) -> None:
    """Returns None when the md5 of the file ``path`` is ``expected``; raises HetflError naming ``label`` otherwise."""
    got = _md5(path)
    if got != expected:
        raise HetflError(f"checksum mismatch for {label}: expected md5 {expected}, got {got}; nothing was kept")


def _md5(path: Path) -> str:
    """The md5 of the file ``path`` (the checksum the datasets' publishers give), in hex."""
    return _digest(path, hashlib.md5(usedforsecurity=False))


def _sha256(path: Path) -> str:
    """The sha256 of the file ``path``, in hex."""
    return _digest(path, hashlib.sha256())


def _digest(path: Path, h) -> str:
    """The hex digest of the file ``path`` by the hash object ``h``, read in chunks (archives are large)."""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _make_folder(folder: Path) -> Path:
    """``folder``, created if missing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HetflError(f"cannot create the download folder {folder}: {e.strerror or e}") from None
    return folder
