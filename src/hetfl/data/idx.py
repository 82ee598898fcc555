"""Reading dataset files: plain or gzip bytes, sha256 checks, and the IDX format of MNIST-style sets.

IDX layout (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code, the number of
dimensions, one big-endian uint32 per dimension, then the values in row-major order.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from ..errors import HetflError

# IDX type code -> element type (multi-byte values are big-endian)
_IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def find_file(folder: Path, name: str) -> Path | None:
    """The path of ``name`` or ``name.gz`` in ``folder``, or None; the .gz wins, as `fetch` writes .gz files."""
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    return None


def read_bytes(path: Path) -> bytes:
    """The content of ``path``, gunzipped when its name ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut-off gzip is an EOFError
        raise HetflError(f"cannot read {path}: {e}") from None


def check_sha256(label: str | Path, data: bytes, expected: str) -> None:
    """Returns None when sha256(data) is ``expected``; raises HetflError naming ``label`` otherwise."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise HetflError(f"checksum mismatch for {label}: expected {expected}, got {got}")


def parse_idx(data: bytes, path: str | Path, ndim: int | None = None) -> np.ndarray:
    """The array held by the IDX bytes ``data`` (read from ``path``, named in errors), in native byte order;
    ``ndim``: the number of dimensions the file must have (3 for images, 1 for labels), if known."""
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_DTYPES:
        raise HetflError(f"{path} is not an IDX file: bad magic number 0x{data[:4].hex()}; "
                         f"expected 0x0000, a type code in {sorted(_IDX_DTYPES)} and the number of dimensions")
    if data[3] == 0 or (ndim is not None and data[3] != ndim):  # else the shape is read from the data: a "size" error
        raise HetflError(f"{path} has a bad IDX magic number 0x{data[:4].hex()}: its last byte says {data[3]} "
                         f"dimensions, expected {ndim or 'at least 1'}"
                         f"{' (images: 3, labels: 1)' if ndim else ''}")
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    header = 4 + 4 * data[3]
    shape = struct.unpack(f">{data[3]}I", data[4:header]) if len(data) >= header else None
    expected = header + math.prod(shape) * dtype.itemsize if shape is not None else header
    if len(data) != expected:
        fits = [code for code, kind in _IDX_DTYPES.items()
                if shape is not None and len(data) == header + math.prod(shape) * np.dtype(kind).itemsize]
        if fits:  # the dimensions agree with the size, the type code does not
            raise HetflError(f"{path} has a bad IDX magic number 0x{data[:4].hex()}: type code 0x{data[2]:02x} "
                             f"does not fit the file's size, type code 0x{fits[0]:02x} would")
        raise HetflError(f"IDX file {path} is truncated or malformed: expected {expected} bytes, got {len(data)}")
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: Path) -> np.ndarray:
    """The array stored in the IDX file ``path`` (plain or .gz)."""
    return parse_idx(read_bytes(path), path)
