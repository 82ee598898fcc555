"""Read a ``.safetensors`` file into torch tensors with nothing but torch and the standard library.

The format (github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header length N,
N bytes of JSON mapping each tensor's name to its dtype, shape and [begin, end) byte offsets in the
data that follows (plus an optional ``__metadata__`` entry), then the data, little-endian, row-major.
Reading it directly lets the pretrained backbone load where ``transformers`` is not installed (a GPU
image with torch alone), and gives the same tensors bit for bit (``tests/test_text.py``).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from ..errors import HetflError

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
MAX_HEADER = 100 << 20  # the format's own limit on the JSON header


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path``, by name (a copy in memory, on the CPU)."""
    data = Path(path).read_bytes()
    try:
        (n,) = struct.unpack("<Q", data[:8])
        if n > MAX_HEADER or 8 + n > len(data):
            raise ValueError(f"a header of {n} bytes")
        header = json.loads(data[8:8 + n])
        body = memoryview(data)[8 + n:]
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
            count = math.prod(shape)
            if not 0 <= begin <= end <= len(body) or end - begin != count * dtype.itemsize:
                raise ValueError(f"{name}: offsets {begin}..{end} do not hold {shape} of {entry['dtype']}")
            flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
            tensors[name] = flat.reshape(shape)
    except (ValueError, KeyError, TypeError, struct.error, json.JSONDecodeError) as e:
        raise HetflError(f"{path} is not a readable safetensors file ({e})") from None
    return tensors
