"""Dataset downloads (Fashion-MNIST, MNIST, EMNIST, CIFAR-10, CIFAR-100): verified before they land, nothing
half-written on failure, nothing written outside the destination."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import http.server
import io
import pickle
import struct
import tarfile
import threading
import zipfile

import numpy as np
import pytest
import torch

from hetfl.cli import main
from hetfl.data import fetch, load_dataset
from hetfl.data.datasets import EMNIST_SPLIT, FMNIST_SHA256, FMNIST_SYSTEM_DIR, IDX_FILES
from hetfl.data.fetch import fetch_fmnist
from hetfl.errors import HetflError

HAVE_FMNIST = all((FMNIST_SYSTEM_DIR / f"{n}.gz").is_file() for n in IDX_FILES)


@pytest.mark.skipif(not HAVE_FMNIST, reason="Debian package dataset-fashion-mnist is not installed")
def test_fetch_from_file_url(tmp_path, monkeypatch):
    source = tmp_path / "mirror"
    source.mkdir()
    for name in IDX_FILES:  # Debian's recompressed .gz: other bytes, same content
        (source / f"{name}.gz").symlink_to(FMNIST_SYSTEM_DIR / f"{name}.gz")
    monkeypatch.setenv("HETFL_CACHE", str(tmp_path / "cache"))
    folder = fetch_fmnist(base_url=source.as_uri())
    assert folder == tmp_path / "cache" / "fashion-mnist"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.gz" for n in IDX_FILES)
    for name, sha in FMNIST_SHA256.items():
        assert hashlib.sha256(gzip.decompress((folder / f"{name}.gz").read_bytes())).hexdigest() == sha
    # files present and valid are not downloaded again: an empty mirror now suffices
    assert fetch_fmnist(base_url=(tmp_path / "empty").as_uri()) == folder


def test_checksum_mismatch_leaves_nothing(tmp_path):
    source = tmp_path / "mirror"
    source.mkdir()
    for name in IDX_FILES:
        (source / f"{name}.gz").write_bytes(gzip.compress(b"not fashion-mnist"))
    dest = tmp_path / "dest"
    with pytest.raises(HetflError, match="checksum mismatch for .*train-images-idx3-ubyte.gz: expected c59f468a"):
        fetch_fmnist(str(dest), base_url=source.as_uri())
    assert list(dest.iterdir()) == []


def test_download_failure(tmp_path):
    dest = tmp_path / "dest"
    message = "download of .*train-images-idx3-ubyte.gz failed.*--data-dir.*dataset-fashion-mnist"
    with pytest.raises(HetflError, match=message):
        fetch_fmnist(str(dest), base_url=(tmp_path / "nothing-here").as_uri())
    assert list(dest.iterdir()) == []


# ---------------------------------------------------------------- MNIST, EMNIST, CIFAR-10, CIFAR-100 from a mirror
# Served from loopback by a real HTTP server; SOURCES (module-level) is where tests point the base URL and md5s.


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the mirror folder without logging each request to stderr."""

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A loopback HTTP server over a fresh folder: (the folder, its base URL)."""
    root = tmp_path / "mirror"
    root.mkdir()
    for var in ("no_proxy", "NO_PROXY"):  # a proxy set in the environment must not be asked for 127.0.0.1
        monkeypatch.setenv(var, "*")
    monkeypatch.delenv("HETFL_DATA_DIR", raising=False)
    monkeypatch.setenv("HETFL_CACHE", str(tmp_path / "cache"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


def md5(data: bytes) -> str:
    """The hex md5 of ``data``."""
    return hashlib.md5(data).hexdigest()


def publish(monkeypatch, mirror, name: str, files: dict[str, bytes], checksums: bool = True) -> None:
    """Puts ``files`` on the mirror and points SOURCES[name] at it (with the files' md5s unless not ``checksums``)."""
    root, url = mirror
    for file, data in files.items():
        (root / file).write_bytes(data)
    source = fetch.SOURCES[name]
    md5s = {file: md5(data) for file, data in files.items()} if checksums else source.md5
    monkeypatch.setitem(fetch.SOURCES, name, dataclasses.replace(source, base_url=url, md5=md5s))


def idx_bytes(a: np.ndarray) -> bytes:
    """The uint8 array ``a`` encoded as an IDX file."""
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(np.uint8).tobytes()


def tarball(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A .tar.gz holding ``members`` (name -> content) and symlinks ``links`` (name -> target), in that order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def zipped(members: dict[str, bytes]) -> bytes:
    """A .zip holding ``members`` (name -> content)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


Expected = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # images (N, C, H, W) and labels, train then test


def cifar_release(folder: str, train: list[str], test: list[str], label_key: bytes) -> tuple[dict, Expected]:
    """A tiny CIFAR python tarball (2 images per batch, pickled as the release is) and what the loader must read."""
    rng = np.random.default_rng(0)
    members, parts = {f"{folder}/batches.meta": b"not read"}, []
    for names in (train, test):
        x = rng.integers(0, 256, (2 * len(names), 3072), dtype=np.uint8)
        y = np.arange(len(x)) % 10
        for i, name in enumerate(names):
            batch = {b"data": x[2 * i:2 * i + 2], label_key: y[2 * i:2 * i + 2].tolist(), b"batch_label": b"x"}
            members[f"{folder}/{name}"] = pickle.dumps(batch, protocol=2)
        parts += [x.reshape(-1, 3, 32, 32), y]
    archive = "cifar-10-python.tar.gz" if "10" in folder else "cifar-100-python.tar.gz"
    return {archive: tarball(members)}, tuple(parts)


def idx_release(prefix: str, names: list[str], transposed: bool) -> tuple[dict[str, bytes], Expected]:
    """Four tiny gzipped IDX files named ``prefix + name + .gz`` (images 4x3, stored transposed for EMNIST) and
    what the loader must read."""
    rng = np.random.default_rng(1)
    x_train, x_test = rng.integers(0, 256, (6, 4, 3), dtype=np.uint8), rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    y_train, y_test = np.arange(6, dtype=np.uint8) % 3, np.arange(4, dtype=np.uint8) % 3
    arrays = [x.transpose(0, 2, 1) if transposed and x.ndim == 3 else x for x in (x_train, y_train, x_test, y_test)]
    files = {f"{prefix}{name}.gz": gzip.compress(idx_bytes(a)) for name, a in zip(names, arrays)}
    return files, (x_train[:, None], y_train, x_test[:, None], y_test)


def release(name: str) -> tuple[dict[str, bytes], Expected]:
    """The files a mirror serves for dataset ``name`` and the arrays the loader must read from the fetched folder."""
    if name == "mnist":
        return idx_release("", list(IDX_FILES), transposed=False)
    if name == "emnist":  # the split the loader reads, another split that must not be extracted, and a traversal
        files, expected = idx_release(f"gzip/emnist-{EMNIST_SPLIT}-", [
            "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "test-images-idx3-ubyte", "test-labels-idx1-ubyte"],
            transposed=True)
        files |= {"gzip/emnist-digits-train-images-idx3-ubyte.gz": b"other split", "../evil.gz": b"evil"}
        return {"gzip.zip": zipped(files)}, expected
    if name == "cifar10":
        return cifar_release("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                             b"labels")
    return cifar_release("cifar-100-python", ["train"], ["test"], b"fine_labels")


def normalized(raw_train: np.ndarray, raw: np.ndarray) -> torch.Tensor:
    """``raw`` (N, C, H, W) normalised per channel with ``raw_train``'s mean and std, as the loader does."""
    t = torch.tensor(raw_train, dtype=torch.float32)
    mean, std = t.mean(dim=(0, 2, 3), keepdim=True), t.std(dim=(0, 2, 3), keepdim=True)
    return (torch.tensor(raw, dtype=torch.float32) - mean) / std


LOADED_FILES = {
    "mnist": {f"{n}.gz" for n in IDX_FILES},
    "emnist": {f"emnist-{EMNIST_SPLIT}-{part}-{kind}-ubyte.gz"
               for part in ("train", "test") for kind in ("images-idx3", "labels-idx1")},
    "cifar10": {*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"},
    "cifar100": {"train", "test"},
}


@pytest.mark.parametrize("name, subdir", [("mnist", "mnist"), ("emnist", "emnist"),
                                          ("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")])
def test_fetch_then_load(name, subdir, mirror, monkeypatch, tmp_path):
    files, (x_train, y_train, x_test, y_test) = release(name)
    publish(monkeypatch, mirror, name, files)
    folder = fetch.fetch_dataset(name)
    assert folder == tmp_path / "cache" / subdir  # where the loader looks last
    archive = name not in ("mnist",)
    assert {p.name for p in folder.iterdir()} == LOADED_FILES[name] | ({fetch.MANIFEST} if archive else set())
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [subdir]  # no temporary folder left beside it
    assert not list(tmp_path.rglob("evil*"))  # the zip's ../evil.gz member is never written

    ds = load_dataset(name)  # found through HETFL_CACHE
    assert ds.y_train.tolist() == y_train.tolist() and ds.y_test.tolist() == y_test.tolist()
    assert ds.input_shape == x_train.shape[1:]
    torch.testing.assert_close(ds.x_train, normalized(x_train, x_train))
    torch.testing.assert_close(ds.x_test, normalized(x_train, x_test))

    # present and valid: not downloaded again, even with the mirror gone
    for f in mirror[0].iterdir():
        f.unlink()
    assert fetch.fetch_dataset(name) == folder
    # a damaged file is: the mirror is back, the file restored
    damaged = folder / sorted(LOADED_FILES[name])[0]
    damaged.write_bytes(b"damaged")
    publish(monkeypatch, mirror, name, files)
    fetch.fetch_dataset(name)
    assert damaged.read_bytes() != b"damaged"


@pytest.mark.parametrize("name, file", [("cifar10", "cifar-10-python.tar.gz"), ("mnist", "train-images-idx3-ubyte.gz")])
def test_md5_mismatch_leaves_nothing(name, file, mirror, monkeypatch, tmp_path):
    files, _ = release(name)
    publish(monkeypatch, mirror, name, files, checksums=False)  # the real checksums: the fixture does not match
    dest = tmp_path / "out" / "d"
    expected = fetch.SOURCES[name].md5[file]
    with pytest.raises(HetflError, match=f"checksum mismatch for .*/{file}: expected md5 {expected}, "
                                         f"got {md5(files[file])}") as e:
        fetch.fetch_dataset(name, str(dest))
    assert len(str(e.value).splitlines()) == 1
    assert list(dest.iterdir()) == [] and [p.name for p in dest.parent.iterdir()] == ["d"]


def cifar10_members(**replaced: bytes) -> dict[str, bytes]:
    """The members of the tiny CIFAR-10 tarball, some replaced or added."""
    names = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    return {f"cifar-10-batches-py/{n}": b"x" for n in names} | replaced


def test_traversal_members_are_not_written(mirror, monkeypatch, tmp_path):
    evil = {"../evil": b"evil", "cifar-10-batches-py/../../evil2": b"evil", str(tmp_path / "evil3"): b"evil",
            "test_batch": b"evil"}  # the right name in the wrong folder is not a member it reads either
    publish(monkeypatch, mirror, "cifar10", {"cifar-10-python.tar.gz": tarball(cifar10_members(**evil))})
    dest = tmp_path / "out" / "d"
    fetch.fetch_dataset("cifar10", str(dest))
    assert not list(tmp_path.rglob("evil*"))
    assert {p.name for p in dest.iterdir()} == LOADED_FILES["cifar10"] | {fetch.MANIFEST}
    assert all((dest / n).read_bytes() == b"x" for n in LOADED_FILES["cifar10"])


@pytest.mark.parametrize("archive, message", [
    (lambda: tarball({k: v for k, v in cifar10_members().items() if not k.endswith("test_batch")},
                     {"cifar-10-batches-py/test_batch": "/etc/passwd"}), "test_batch is not a regular file"),  # a link
    (lambda: tarball({k: v for k, v in cifar10_members().items() if not k.endswith("test_batch")}),
     "lacks cifar-10-batches-py/test_batch"),
], ids=["link", "missing"])
def test_bad_archive_leaves_nothing(archive, message, mirror, monkeypatch, tmp_path):
    publish(monkeypatch, mirror, "cifar10", {"cifar-10-python.tar.gz": archive()})
    dest = tmp_path / "out" / "d"
    with pytest.raises(HetflError, match=message):
        fetch.fetch_dataset("cifar10", str(dest))
    assert list(dest.iterdir()) == [] and [p.name for p in dest.parent.iterdir()] == ["d"]


def test_download_failure_names_the_url(mirror, monkeypatch, tmp_path):
    publish(monkeypatch, mirror, "cifar100", {}, checksums=False)  # nothing served: 404
    dest = tmp_path / "d"
    message = (r"download of http://127\.0\.0\.1:\d+/cifar-100-python\.tar\.gz failed \(HTTP Error 404: .*\); "
               r"download cifar-100-python.tar.gz elsewhere, unpack it and pass --data-dir DIR "
               r"\(or set HETFL_DATA_DIR\)")
    with pytest.raises(HetflError, match=message):
        fetch.fetch_dataset("cifar100", str(dest))
    assert list(dest.iterdir()) == []


def test_not_found_says_fetch(tmp_path, monkeypatch):
    monkeypatch.delenv("HETFL_DATA_DIR", raising=False)
    monkeypatch.setenv("HETFL_CACHE", str(tmp_path))
    with pytest.raises(HetflError, match=f"looked in: {tmp_path / 'cifar-100-python'}; "
                                         r"run `hetfl data fetch cifar100` or pass --data-dir DIR"):
        load_dataset("cifar100")


def test_cli_fetch_prints_the_checksum(mirror, monkeypatch, tmp_path, capsys):
    files, _ = release("cifar10")
    publish(monkeypatch, mirror, "cifar10", files)
    dest = tmp_path / "d"
    assert main(["data", "fetch", "cifar10", "--dest", str(dest)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"CIFAR-10 is in {dest} (cifar-10-python.tar.gz, md5 {md5(files['cifar-10-python.tar.gz'])})"
    assert load_dataset("cifar10", str(dest)).num_classes == 10


def test_cli_fetch_unknown_name(capsys):
    assert main(["data", "fetch", "imagenet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'imagenet'" in err[0]
    assert "fmnist, mnist, emnist, cifar10, cifar100, r8, 20ng" in err[0]
