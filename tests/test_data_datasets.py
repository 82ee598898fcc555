"""The dataset registry: IDX, CIFAR, npz, digits and the real Fashion-MNIST files."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfl.data import DATASET_NAMES, load_dataset
from hetfl.data.datasets import FMNIST_SYSTEM_DIR, IDX_FILES
from hetfl.data.idx import read_idx
from hetfl.errors import HetflError

HAVE_FMNIST = all((FMNIST_SYSTEM_DIR / f"{n}.gz").is_file() for n in IDX_FILES)


def idx_bytes(a: np.ndarray) -> bytes:
    """``a`` (uint8 or int32) encoded as an IDX file."""
    code = {np.dtype("u1"): 0x08, np.dtype("i4"): 0x0C}[a.dtype]
    header = bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


def write(path: Path, data: bytes) -> Path:
    """Writes ``data`` to ``path`` (gzipped when the name ends in .gz) and returns the path."""
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def fake_mnist(rng, n_train=12, n_test=6, h=5, w=7) -> tuple[np.ndarray, ...]:
    """Random uint8 images (non-square) and labels covering classes 0..9."""
    return (rng.integers(0, 256, (n_train, h, w), dtype=np.uint8), np.arange(n_train, dtype=np.uint8) % 10,
            rng.integers(0, 256, (n_test, h, w), dtype=np.uint8), np.arange(n_test, dtype=np.uint8) % 10)


def write_idx_set(folder: Path, arrays, names=IDX_FILES, gz=False) -> Path:
    """The four arrays written as IDX files ``names`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for a, name in zip(arrays, names):
        write(folder / (name + (".gz" if gz else "")), idx_bytes(a))
    return folder


def normalized(raw_train: np.ndarray, raw: np.ndarray) -> torch.Tensor:
    """``raw`` (N, C, H, W) normalised per channel with ``raw_train``'s mean and std, as the loader should."""
    t = torch.tensor(raw_train, dtype=torch.float32)
    mean, std = t.mean(dim=(0, 2, 3), keepdim=True), t.std(dim=(0, 2, 3), keepdim=True)
    return (torch.tensor(raw, dtype=torch.float32) - mean) / std


# ---------------------------------------------------------------- IDX files


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", ["u1", "i4"])
def test_read_idx_plain_and_gzip(tmp_path, suffix, dtype):
    a = np.random.default_rng(0).integers(-100 if dtype == "i4" else 0, 256, (3, 4, 5)).astype(dtype)
    assert np.array_equal(read_idx(write(tmp_path / f"a{suffix}", idx_bytes(a))), a)


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x08\x03\x00\x00", b"\x01\x02\x08\x01", b"\x00\x00\x42\x01"])
def test_malformed_idx_names_the_file(tmp_path, data):
    path = write(tmp_path / "broken-idx", data)
    with pytest.raises(HetflError, match="broken-idx"):
        read_idx(path)


@pytest.mark.parametrize("cut", [1, 40])
def test_truncated_idx_names_the_file(tmp_path, cut):
    path = write(tmp_path / "cut-idx3-ubyte", idx_bytes(np.zeros((4, 5, 6), np.uint8))[:-cut])
    with pytest.raises(HetflError, match="cut-idx3-ubyte.*truncated"):
        read_idx(path)


def test_truncated_gzip_names_the_file(tmp_path):
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((40, 5), np.uint8)))[:-10])
    with pytest.raises(HetflError, match="t.gz"):
        read_idx(path)


# ---------------------------------------------------------------- MNIST-style folders


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_loader(tmp_path, gz):
    raw = fake_mnist(np.random.default_rng(1))
    ds = load_dataset("mnist", str(write_idx_set(tmp_path, raw, gz=gz)))
    assert ds.name == "mnist" and ds.num_classes == 10 and ds.input_shape == (1, 5, 7)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert torch.equal(ds.y_train, torch.from_numpy(raw[1].astype(np.int64)))
    assert torch.equal(ds.y_test, torch.from_numpy(raw[3].astype(np.int64)))
    torch.testing.assert_close(ds.x_train, normalized(raw[0][:, None], raw[0][:, None]))
    torch.testing.assert_close(ds.x_test, normalized(raw[0][:, None], raw[2][:, None]))


def test_loaded_once_per_process(tmp_path):
    folder = str(write_idx_set(tmp_path, fake_mnist(np.random.default_rng(2))))
    assert load_dataset("mnist", folder) is load_dataset("mnist", folder + "/")


def test_data_dir_env_and_subfolder(tmp_path, monkeypatch):
    raw = fake_mnist(np.random.default_rng(3))
    write_idx_set(tmp_path / "mnist", raw)
    monkeypatch.setenv("HETFL_DATA_DIR", str(tmp_path))
    from_env = load_dataset("mnist")
    assert torch.equal(from_env.y_train, torch.from_numpy(raw[1].astype(np.int64)))
    assert load_dataset("mnist", str(tmp_path)) is from_env  # data_dir's "mnist" subfolder is the same folder


def test_emnist_images_are_transposed_back(tmp_path):
    raw = fake_mnist(np.random.default_rng(4), h=5, w=7)
    stored = [a.transpose(0, 2, 1) if a.ndim == 3 else a for a in raw]  # how the EMNIST release stores images
    names = [f"emnist-balanced-{part}-{kind}-ubyte"
             for part in ("train", "test") for kind in ("images-idx3", "labels-idx1")]
    ds = load_dataset("emnist", str(write_idx_set(tmp_path, stored, names, gz=True)))
    assert ds.input_shape == (1, 5, 7)
    torch.testing.assert_close(ds.x_train, normalized(raw[0][:, None], raw[0][:, None]))


def test_idx_prefix_loader(tmp_path):
    raw = fake_mnist(np.random.default_rng(5))
    raw = (raw[0], raw[1] % 4, raw[2], raw[3] % 4)
    ds = load_dataset(f"idx:{write_idx_set(tmp_path, raw)}")
    assert ds.num_classes == 4 and ds.x_test.shape == (6, 1, 5, 7)


def test_missing_files_in_data_dir(tmp_path):
    with pytest.raises(HetflError, match=r"train-images-idx3-ubyte.*--data-dir"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(HetflError, match=r"fetch fmnist.*--data-dir"):
        load_dataset("fmnist", str(tmp_path))
    with pytest.raises(HetflError, match="does not exist"):
        load_dataset(f"idx:{tmp_path / 'nowhere'}")


def test_label_beyond_known_class_count(tmp_path):
    raw = list(fake_mnist(np.random.default_rng(6)))
    raw[3][0] = 10
    with pytest.raises(HetflError, match=r"labels must be in \[0, 10\)"):
        load_dataset("mnist", str(write_idx_set(tmp_path, raw)))


def test_unknown_name_lists_choices():
    with pytest.raises(HetflError, match=r"'foo' is unknown; choose one of: fmnist, digits.*npz:PATH, idx:DIR"):
        load_dataset("foo")


# ---------------------------------------------------------------- CIFAR


def write_cifar(folder: Path, names, label_key: bytes, rng, per_batch=4) -> list[dict]:
    """Batches in the release format (dict of bytes keys, rows of 3072 uint8) written to ``names``."""
    folder.mkdir(parents=True, exist_ok=True)
    batches = []
    for i, name in enumerate(names):
        batch = {b"batch_label": name.encode(), b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 label_key: [(i * per_batch + j) % 10 for j in range(per_batch)], b"coarse_labels": [19] * per_batch}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        batches.append(batch)
    return batches


@pytest.mark.parametrize("dataset, subdir, train, test, label_key, classes", [
    ("cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10),
    ("cifar100", "cifar-100-python", ["train"], ["test"], b"fine_labels", 100),
])
def test_cifar_loader(tmp_path, dataset, subdir, train, test, label_key, classes):
    rng = np.random.default_rng(7)
    train_batches = write_cifar(tmp_path / subdir, train, label_key, rng)
    test_batches = write_cifar(tmp_path / subdir, test, label_key, rng)
    ds = load_dataset(dataset, str(tmp_path))  # the release's subfolder of data_dir
    rows = np.concatenate([b[b"data"] for b in train_batches]).astype(np.float64)
    assert ds.x_train.shape == (len(rows), 3, 32, 32) and ds.num_classes == classes
    assert ds.y_train.tolist() == [y for b in train_batches for y in b[label_key]]
    assert ds.y_test.tolist() == [y for b in test_batches for y in b[label_key]]
    # row layout: 1024 red values row-major, then 1024 green, then 1024 blue
    planes = [rows[:, c * 1024:(c + 1) * 1024] for c in range(3)]
    for n, c, i, j in [(0, 0, 0, 1), (1, 1, 5, 7), (len(rows) - 1, 2, 31, 0), (3, 2, 17, 30)]:
        expected = (rows[n, c * 1024 + i * 32 + j] - planes[c].mean()) / planes[c].std(ddof=1)
        assert ds.x_train[n, c, i, j].item() == pytest.approx(expected, abs=1e-4)


def test_cifar_batch_without_labels(tmp_path):
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    write_cifar(tmp_path, names, b"fine_labels", np.random.default_rng(8))
    with pytest.raises(HetflError, match=r"data_batch_1 lacks the keys \['labels'\]"):
        load_dataset("cifar10", str(tmp_path))


# ---------------------------------------------------------------- npz


def test_npz_channel_last_and_first(tmp_path):
    rng = np.random.default_rng(9)
    x = rng.random((8, 5, 6, 3)).astype(np.float32)
    y = np.arange(8) % 3
    np.savez(tmp_path / "last.npz", x_train=x, y_train=y, x_test=x[:2], y_test=y[:2])
    xf = x.transpose(0, 3, 1, 2)
    np.savez(tmp_path / "first.npz", x_train=xf, y_train=y, x_test=xf[:2], y_test=y[:2])
    np.savez(tmp_path / "gray.npz", x_train=x[..., 0], y_train=y, x_test=x[:2, ..., 0], y_test=y[:2])
    last, first = load_dataset(f"npz:{tmp_path / 'last.npz'}"), load_dataset(f"npz:{tmp_path / 'first.npz'}")
    assert last.input_shape == first.input_shape == (3, 5, 6) and last.num_classes == 3
    torch.testing.assert_close(last.x_train, first.x_train)
    torch.testing.assert_close(last.x_train, normalized(xf, xf))
    assert load_dataset(f"npz:{tmp_path / 'gray.npz'}").input_shape == (1, 5, 6)


def test_npz_missing_key_and_file(tmp_path):
    np.savez(tmp_path / "part.npz", x_train=np.zeros((2, 4, 4)), y_train=np.zeros(2), x_test=np.zeros((1, 4, 4)))
    with pytest.raises(HetflError, match="part.npz lacks the arrays y_test"):
        load_dataset(f"npz:{tmp_path / 'part.npz'}")
    with pytest.raises(HetflError, match="does not exist"):
        load_dataset(f"npz:{tmp_path / 'none.npz'}")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(HetflError, match="single.npy is not a zip archive; write it with numpy.savez"):
        load_dataset(f"npz:{tmp_path / 'single.npy'}")


def test_npz_bad_labels(tmp_path):
    x = np.zeros((2, 4, 4))
    np.savez(tmp_path / "bad.npz", x_train=x, y_train=[0.5, 1], x_test=x, y_test=[0, 1])
    with pytest.raises(HetflError, match="y_train must hold non-negative integer class labels"):
        load_dataset(f"npz:{tmp_path / 'bad.npz'}")


# ---------------------------------------------------------------- digits and Fashion-MNIST


def test_digits_fixed_split():
    from sklearn.datasets import load_digits

    ds = load_dataset("digits")
    target = load_digits().target
    assert ds.x_train.shape == (1497, 1, 8, 8) and ds.x_test.shape == (300, 1, 8, 8) and ds.num_classes == 10
    assert ds.y_test.tolist() == target[::6].tolist()  # a fixed rule, not a seed-dependent draw
    assert sorted(ds.y_train.tolist() + ds.y_test.tolist()) == sorted(target.tolist())


@pytest.mark.skipif(not HAVE_FMNIST, reason="Debian package dataset-fashion-mnist is not installed")
def test_fmnist_real_files():
    ds = load_dataset("fmnist", str(FMNIST_SYSTEM_DIR))
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.num_classes == 10 and torch.equal(ds.y_train.bincount(), torch.full((10,), 6000))
    assert abs(ds.x_train.mean().item()) < 1e-4 and abs(ds.x_train.std().item() - 1) < 1e-4
    assert abs(ds.x_test.mean().item()) < 0.05


@pytest.mark.skipif(not HAVE_FMNIST, reason="Debian package dataset-fashion-mnist is not installed")
def test_fmnist_checksum_mismatch(tmp_path):
    for name in IDX_FILES[:3]:
        (tmp_path / f"{name}.gz").symlink_to(FMNIST_SYSTEM_DIR / f"{name}.gz")
    labels = bytearray(gzip.decompress((FMNIST_SYSTEM_DIR / f"{IDX_FILES[3]}.gz").read_bytes()))
    labels[100] ^= 1  # one flipped bit, still a well-formed IDX file
    (tmp_path / IDX_FILES[3]).write_bytes(bytes(labels))
    with pytest.raises(HetflError, match=f"checksum mismatch for .*{IDX_FILES[3]}: expected 0402a96d"):
        load_dataset("fmnist", str(tmp_path))


def test_dataset_names():
    assert DATASET_NAMES == ("fmnist", "digits", "mnist", "emnist", "cifar10", "cifar100", "r8", "20ng")
