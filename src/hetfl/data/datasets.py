"""The dataset registry: finds a dataset's files, reads them once and returns normalised tensors.

Where each dataset is looked for (the first folder holding its files wins):

* ``data_dir`` when given (the folder itself, or its subfolder named below), else
* ``$HETFL_DATA_DIR/<subfolder>``: fashion-mnist, mnist, emnist, cifar-10-batches-py, cifar-100-python, else
* fmnist only: /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist), else
* the download cache ``$HETFL_CACHE/<subfolder>`` (default ~/.cache/hetfl), where `hetfl data fetch NAME`
  (``data/fetch.py``) puts each of fmnist, mnist, emnist, cifar10 and cifar100.

``digits`` ships with scikit-learn; ``npz:PATH`` and ``idx:DIR`` read the user's own files.
``20ng``, ``r8`` and the user's ``text:DIR`` are text (``data/text.py``): token ids of the pretrained backbone's
tokenizer.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import HetflError, spans, warn
from ..paths import cache_root
from .idx import check_sha256, find_file, parse_idx, read_bytes
from .text import TEXT_DATASETS, USER_PREFIX, is_text, load_text

DATASET_NAMES = ("fmnist", "digits", "mnist", "emnist", "cifar10", "cifar100", *TEXT_DATASETS)

# The standard MNIST-style names: train images, train labels, test images, test labels.
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# sha256 of the gunzipped official Fashion-MNIST files (Debian recompresses the .gz, so hash the content).
FMNIST_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
FMNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
EMNIST_SPLIT = "balanced"
MAX_CLASSES = 100_000  # labels above this are refused before anything is sized by them
DIGITS_TEST_EVERY = 6  # digits: samples 0, 6, 12, ... form the test set (300 of 1797), a fixed split

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, y_train, x_test, y_test


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train and test tensors of one dataset: images normalised per channel with the train set's mean and std,
    or token ids."""

    name: str
    x_train: torch.Tensor  # float32 (N, C, H, W), or int64 token ids (N, L)
    y_train: torch.Tensor  # int64 (N,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The (C, H, W) shape of one image, or (L,) of one document's token ids."""
        return tuple(self.x_train.shape[1:])


def fmnist_cache_dir() -> Path:
    """The folder where `fetch_fmnist` puts Fashion-MNIST by default."""
    return cache_root() / "fashion-mnist"


def dataset_cache_dir(name: str) -> Path:
    """The folder where `hetfl data fetch NAME` puts dataset ``name`` (mnist, emnist, cifar10, ...) by default."""
    return cache_root() / _FOLDER_DATASETS[name].subdir


# ---------------------------------------------------------------- file formats


def _emnist_files(split: str) -> tuple[str, ...]:
    """The EMNIST release's names for the four IDX files of ``split`` (it says test where MNIST says t10k)."""
    return tuple(f"emnist-{split}-{part}-{kind}-ubyte"
                 for part in ("train", "test") for kind in ("images-idx3", "labels-idx1"))


@dataclass(frozen=True)
class _IdxFormat:
    """Four IDX files under one of several naming schemes, optionally checksummed."""

    name_sets: tuple[tuple[str, ...], ...] = (IDX_FILES,)
    sha256: Mapping[str, str] | None = None  # keyed by the standard names
    transpose: bool = False  # EMNIST stores each image transposed

    @property
    def needs(self) -> str:
        """The files this format needs, for error messages."""
        return " or ".join(", ".join(f"{n}[.gz]" for n in names) for names in self.name_sets)

    def _paths(self, folder: Path) -> list[Path] | None:
        """The four files in ``folder`` under the first naming scheme found complete, or None."""
        for names in self.name_sets:
            paths = [find_file(folder, n) for n in names]
            if all(paths):
                return paths
        return None

    def present(self, folder: Path) -> bool:
        """Whether ``folder`` holds the four files."""
        return self._paths(folder) is not None

    def read(self, folder: Path) -> Arrays:
        """The arrays stored in ``folder``."""
        paths = self._paths(folder)
        x_train, y_train, x_test, y_test = (self._read_one(path, name) for path, name in zip(paths, IDX_FILES))
        if self.transpose:
            x_train, x_test = x_train.swapaxes(1, 2), x_test.swapaxes(1, 2)
        return x_train, y_train, x_test, y_test

    def _read_one(self, path: Path, standard_name: str) -> np.ndarray:
        """The array in ``path``, after checking its checksum when this format has one."""
        data = read_bytes(path)
        if self.sha256:
            check_sha256(path, data, self.sha256[standard_name])
        return parse_idx(data, path, ndim=3 if "images" in standard_name else 1)


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that builds numpy arrays and plain containers only: a pickle can name any callable, and a
    batch file from elsewhere must not run code while it is read."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("numpy.core.numeric", "_frombuffer"),
               ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}  # protocol 2 writes bytes so

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch does not hold")
        return super().find_class(module, name)


def _integer_array(value) -> np.ndarray | None:
    """``value`` (an unpickled array or list) as an integer array, or None when it is not one: no conversion is
    forced, so words, floats, objects and ragged lists are refused instead of cast (or wrapped round) to uint8."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return None
    return array if array.dtype.kind in "iu" else None


@dataclass(frozen=True)
class _CifarFormat:
    """The CIFAR python release: pickled dicts with b'data' (N, 3072 uint8, R then G then B planes) and labels."""

    train: tuple[str, ...]
    test: tuple[str, ...]
    label_key: bytes

    @property
    def needs(self) -> str:
        """The files this format needs, for error messages."""
        return ", ".join(self.train + self.test)

    def present(self, folder: Path) -> bool:
        """Whether ``folder`` holds every batch file."""
        return all((folder / n).is_file() for n in self.train + self.test)

    def read(self, folder: Path) -> Arrays:
        """The arrays stored in ``folder``."""
        return (*self._read_batches(folder, self.train), *self._read_batches(folder, self.test))

    def _read_batches(self, folder: Path, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Images (N, 3, 32, 32) and labels of the batch files ``names``, concatenated."""
        batches = [self._read_batch(folder / n) for n in names]
        return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])

    def _read_batch(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """Images (N, 3, 32, 32) and labels of one batch file."""
        try:
            with open(path, "rb") as f:
                batch = _ArraysOnly(f, encoding="bytes").load()  # the release was pickled by Python 2
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError) as e:
            raise HetflError(f"cannot read CIFAR batch {path}: {e}") from None
        missing = [k.decode() for k in (b"data", self.label_key) if not isinstance(batch, dict) or k not in batch]
        if missing:
            raise HetflError(f"CIFAR batch {path} lacks the keys {missing}; "
                             f"expected a dict with b'data' and {self.label_key!r}")
        data = _integer_array(batch[b"data"])
        if data is None or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or \
                (data.size and not 0 <= data.min() <= data.max() <= 255):
            shape = "no array" if data is None else f"shape {data.shape}, dtype {data.dtype}"
            raise HetflError(f"CIFAR batch {path}: b'data' must be integers 0..255 of shape (N, 3072), got {shape}")
        labels = _integer_array(batch[self.label_key])
        if labels is None or labels.ndim != 1 or len(labels) != len(data) or \
                (labels.size and not 0 <= labels.min() <= labels.max() <= MAX_CLASSES):
            raise HetflError(f"CIFAR batch {path}: {self.label_key!r} must be {len(data)} class labels, one per image "
                             f"(integers 0..{MAX_CLASSES})")
        return data.astype(np.uint8).reshape(-1, 3, 32, 32), labels.astype(np.int64)


# ---------------------------------------------------------------- where datasets live


@dataclass(frozen=True)
class _FolderDataset:
    """A dataset read from one folder, with where to look for it."""

    format: _IdxFormat | _CifarFormat
    subdir: str  # its folder name under HETFL_DATA_DIR (and accepted under data_dir)
    num_classes: int | None  # None: max label + 1
    fallbacks: Callable[[], tuple[Path, ...]] = tuple  # folders tried after HETFL_DATA_DIR
    hint: str = "pass --data-dir DIR or set HETFL_DATA_DIR"

    def candidates(self, data_dir: str | None) -> list[Path]:
        """The folders to look in, in order."""
        if data_dir:
            base = Path(data_dir).expanduser()
            return [base, base / self.subdir]
        env = os.environ.get("HETFL_DATA_DIR")
        return ([Path(env).expanduser() / self.subdir] if env else []) + list(self.fallbacks())


def _fmnist_fallbacks() -> tuple[Path, ...]:
    """Where fmnist lives when neither data_dir nor HETFL_DATA_DIR holds it."""
    return FMNIST_SYSTEM_DIR, fmnist_cache_dir()


def _in_cache(subdir: str) -> Callable[[], tuple[Path, ...]]:
    """The ``fallbacks`` of a dataset that `hetfl data fetch` downloads: its folder in the download cache, looked
    up when called (HETFL_CACHE may change)."""
    return lambda: (cache_root() / subdir,)


def _fetch_hint(name: str) -> str:
    """The advice given when dataset ``name`` is not found."""
    return f"run `hetfl data fetch {name}` or pass --data-dir DIR"


_FOLDER_DATASETS = {
    "fmnist": _FolderDataset(_IdxFormat(sha256=FMNIST_SHA256), "fashion-mnist", 10, _fmnist_fallbacks,
                             _fetch_hint("fmnist")),
    "mnist": _FolderDataset(_IdxFormat(), "mnist", 10, _in_cache("mnist"), _fetch_hint("mnist")),
    "emnist": _FolderDataset(_IdxFormat((IDX_FILES, _emnist_files(EMNIST_SPLIT)), transpose=True), "emnist", None,
                             _in_cache("emnist"), _fetch_hint("emnist")),
    "cifar10": _FolderDataset(_CifarFormat(tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), b"labels"),
                              "cifar-10-batches-py", 10, _in_cache("cifar-10-batches-py"), _fetch_hint("cifar10")),
    "cifar100": _FolderDataset(_CifarFormat(("train",), ("test",), b"fine_labels"), "cifar-100-python", 100,
                               _in_cache("cifar-100-python"), _fetch_hint("cifar100")),
}


def _find_folder(name: str, fmt: _IdxFormat | _CifarFormat, candidates: list[Path], hint: str) -> Path:
    """The first of ``candidates`` holding the files of ``fmt``, resolved."""
    for folder in candidates:
        if fmt.present(folder):
            return folder.resolve()
    looked = ", ".join(map(str, candidates)) or "nowhere (no data_dir given and HETFL_DATA_DIR is not set)"
    raise HetflError(f"dataset '{name}': files not found ({fmt.needs}); looked in: {looked}; {hint}")


# ---------------------------------------------------------------- other sources


def _read_digits() -> Arrays:
    """scikit-learn's 8x8 digits (values 0..16), split into train and test by a fixed rule."""
    try:
        from sklearn.datasets import load_digits  # optional dependency, imported only when asked for
    except ImportError:
        raise HetflError("dataset 'digits' needs scikit-learn; run: pip install 'hetfl[digits]'") from None
    bunch = load_digits()
    test = np.arange(len(bunch.target)) % DIGITS_TEST_EVERY == 0
    return bunch.images[~test], bunch.target[~test], bunch.images[test], bunch.target[test]


def _read_npz(path: Path) -> Arrays:
    """The arrays x_train, y_train, x_test, y_test of the .npz file ``path``."""
    keys = ("x_train", "y_train", "x_test", "y_test")
    if not zipfile.is_zipfile(path):
        raise HetflError(f"npz file {path} is not a zip archive; "
                         f"write it with numpy.savez(path, {', '.join(f'{k}=...' for k in keys)})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise HetflError(f"npz file {path} lacks the arrays {', '.join(missing)}; it needs {', '.join(keys)}")
            return tuple(npz[k] for k in keys)
    except (OSError, ValueError, zipfile.BadZipFile) as e:  # a corrupt member, or pickled objects
        raise HetflError(f"cannot read npz file {path}: {e}") from None


def _existing(path: str, kind: str, name: str) -> Path:
    """``path`` resolved, after checking it is an existing file or folder (``kind``)."""
    p = Path(path).expanduser()
    if not (p.is_file() if kind == "file" else p.is_dir()):
        raise HetflError(f"dataset '{name}': {kind} {path!r} does not exist")
    return p.resolve()


# ---------------------------------------------------------------- tensors


def _images(x: np.ndarray, where: str) -> torch.Tensor:
    """``x`` as a float32 (N, C, H, W) tensor; (N, H, W) gains a channel, (N, H, W, C) with C in {1, 3} is moved."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":  # text, objects, complex numbers, dates: not pixel values
        raise HetflError(f"{where} must hold real numbers (pixel values), got dtype {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim != 4:
        raise HetflError(f"{where} must have shape (N, H, W), (N, C, H, W) or (N, H, W, C), got {x.shape}")
    return torch.tensor(np.ascontiguousarray(x), dtype=torch.float32)


def _labels(y: np.ndarray, n: int, where: str) -> torch.Tensor:
    """``y`` as an int64 tensor, after checking it holds ``n`` non-negative integers."""
    y = np.asarray(y)
    if y.shape != (n,):
        raise HetflError(f"{where} must have shape ({n},), one label per image, got {y.shape}")
    if y.dtype.kind not in "iuf" or (n and (not np.isfinite(y).all() or np.any(y != np.round(y)) or y.min() < 0)):
        raise HetflError(f"{where} must hold non-negative integer class labels, got dtype {y.dtype}")
    if n and y.max() > MAX_CLASSES:  # a class index this large is a stray value, and would size every histogram
        raise HetflError(f"{where} holds label {int(y.max())}; labels are class indices 0..C-1 with C <= {MAX_CLASSES}")
    return torch.tensor(y.astype(np.int64))


def _build(name: str, arrays: Arrays, num_classes: int | None) -> Dataset:
    """A Dataset from raw arrays, normalised per channel with the train set's statistics."""
    x_train, x_test = _images(arrays[0], f"{name} x_train"), _images(arrays[2], f"{name} x_test")
    y_train = _labels(arrays[1], len(x_train), f"{name} y_train")
    y_test = _labels(arrays[3], len(x_test), f"{name} y_test")
    if len(x_train) == 0 or len(x_test) == 0 or x_train.shape[1:] != x_test.shape[1:]:
        raise HetflError(f"{name}: need a non-empty train set and a non-empty test set of the train images' shape, "
                         f"got train {tuple(x_train.shape)} and test {tuple(x_test.shape)}")
    for what, x in (("x_train", x_train), ("x_test", x_test)):
        bad = int((~torch.isfinite(x)).sum())
        if bad:  # one NaN makes the normalisation, and so every input, NaN: the model silently learns nothing
            raise HetflError(f"{name} {what} holds {bad} non-finite values (NaN or inf); clean or drop those samples")
    num_classes = _check_classes(name, y_train, y_test, num_classes)
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant channel stays constant instead of becoming NaN
    for x in (x_train, x_test):
        x.sub_(mean).div_(std)
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes)


def _check_classes(name: str, y_train: torch.Tensor, y_test: torch.Tensor, num_classes: int | None) -> int:
    """The class count (``num_classes``, or max label + 1 when the format does not say), after checking the labels.

    Where the count is inferred, a class index that no sample has means a stray label (an IDX label
    of 200 among 0..9 would make a 201-class model): an error. A test class that no training sample
    has cannot be learned: a warning.
    """
    top = int(torch.cat([y_train, y_test]).max()) + 1
    if num_classes is not None and top > num_classes:
        raise HetflError(f"{name}: labels must be in [0, {num_classes}), got label {top - 1}")
    count = num_classes or top
    if count < 2:
        raise HetflError(f"{name}: the labels hold one class ({count - 1}); classification needs at least 2")
    in_train = torch.bincount(y_train, minlength=count) > 0
    in_test = torch.bincount(y_test, minlength=count) > 0
    if num_classes is None and not (in_train | in_test).all():
        raise HetflError(f"{name}: labels must be the class indices 0..C-1, but classes "
                         f"{_spans(~(in_train | in_test))} of 0..{top - 1} have no sample; label {top - 1} looks "
                         "out of range (relabel the classes as 0, 1, 2, ...)")
    if (in_test & ~in_train).any():
        warn(f"{name}: test classes {_spans(in_test & ~in_train)} have no training sample; "
             "no model can learn them")
    return count


def _spans(mask: torch.Tensor) -> str:
    """The indices where ``mask`` is true, as compact ranges: "3, 10..199" (the first 6 ranges)."""
    return spans(mask.nonzero().flatten().tolist(), limit=6)


# ---------------------------------------------------------------- public entry point

_LOADED: dict[tuple[str, str], Dataset] = {}  # (kind, resolved path) -> dataset, so a process reads files once


def _resolve(name: str, data_dir: str | None) -> tuple[tuple[str, str], Callable[[], Arrays], int | None]:
    """The cache key, the reader and the known class count (or None) of dataset ``name``."""
    if name in _FOLDER_DATASETS:
        spec = _FOLDER_DATASETS[name]
        folder = _find_folder(name, spec.format, spec.candidates(data_dir), spec.hint)
        return (name, str(folder)), lambda: spec.format.read(folder), spec.num_classes
    if name == "digits":
        return (name, ""), _read_digits, 10
    if name.startswith("npz:"):
        path = _existing(name[4:], "file", name)
        return ("npz", str(path)), lambda: _read_npz(path), None
    if name.startswith("idx:"):
        fmt = _IdxFormat()
        folder = _find_folder(name, fmt, [_existing(name[4:], "folder", name)], "idx:DIR needs a folder holding them")
        return ("idx", str(folder)), lambda: fmt.read(folder), None
    raise HetflError(f"dataset {name!r} is unknown; choose one of: {', '.join(DATASET_NAMES)}, npz:PATH, idx:DIR, "
                     "text:DIR")


def _load_text(name: str, data_dir: str | None, max_length: int) -> Dataset:
    """Text dataset ``name`` as token ids of the pretrained backbone's tokenizer, read once per process."""
    from ..models.minilm import pretrained_dir  # the backbone whose tokenizer the ids are for

    tokenizer = pretrained_dir() / "tokenizer.json"
    # text:DIR reads DIR alone (data_dir does not apply), resolved: a relative DIR names one folder per process
    source = Path(name[len(USER_PREFIX):]).expanduser().resolve() if name.startswith(USER_PREFIX) else data_dir or ""
    key = (f"{name}:{max_length}", f"{source}|{tokenizer.resolve()}")
    if key not in _LOADED:
        x_train, y_train, x_test, y_test, classes = load_text(name, data_dir, tokenizer, max_length)
        _LOADED[key] = Dataset(name, x_train, y_train, x_test, y_test, len(classes))
    return _LOADED[key]


def load_dataset(name: str, data_dir: str | None = None, max_length: int = 128) -> Dataset:
    """The dataset ``name`` (see DATASET_NAMES, npz:PATH, idx:DIR, text:DIR), read once per process and then cached;
    text datasets as ``max_length`` token ids per document."""
    if is_text(name):
        return _load_text(name, data_dir or None, max_length)
    key, read, num_classes = _resolve(name, data_dir or None)
    if key not in _LOADED:
        _LOADED[key] = _build(name, read(), num_classes)
    return _LOADED[key]
