"""A GGUF file's header (metadata and tensor table) read in one sequential pass.

Why not ``gguf.GGUFReader`` for this part: it makes a numpy view per value, so a 49k-token
vocabulary and its merges (~300k values) took 2-2.5 s to parse per open of SmolLM2's file on this
box (7 s under a profiler), and an engine opens its file twice (weights, tokenizer): most of the
start-up of ``tokenops serve`` on the default model, and most of a model load when models are
loaded on demand. Here the header is walked with ``struct`` over the mapped bytes, numeric arrays
are taken whole with ``numpy.frombuffer``: 0.1 s for the same file (``tests/engine/test_gguf_header.py``
checks every key and tensor against ``GGUFReader`` on the packaged model and on generated files).

The values are those ``ReaderField.contents()`` gives (Python scalars, ``str``, flat lists). What this
reader does not take (a big-endian file, an array of arrays, an unknown value type) raises
:class:`UnsupportedHeader`, and the caller falls back to ``GGUFReader``.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

#: GGUF value types: (struct format, numpy dtype) of the fixed-size ones
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),  # bool: one byte
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY = 8, 9


class UnsupportedHeader(ValueError):
    """A header this reader does not parse (the caller uses ``gguf.GGUFReader`` instead)."""


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.at = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        (length,) = struct.unpack_from("<Q", self.buf, self.at)
        start = self.at + 8
        self.at = start + length
        return str(self.buf[start : self.at], encoding="utf-8")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        if vtype not in _SCALARS:
            raise UnsupportedHeader(f"unknown GGUF value type {vtype}")
        value = self.unpack(_SCALARS[vtype][0])
        return bool(value) if vtype == 7 else value

    def array(self) -> list[Any]:
        item_type, count = self.unpack("<I"), self.unpack("<Q")
        if item_type == _STRING:
            return [self.string() for _ in range(count)]
        if item_type not in _SCALARS:
            raise UnsupportedHeader(f"GGUF arrays of type {item_type} are not read here")
        dtype = np.dtype(_SCALARS[item_type][1])
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.at)
        self.at += count * dtype.itemsize
        return [bool(v) for v in values.tolist()] if item_type == 7 else values.tolist()


def read_header(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int, int]]]:
    """``(metadata, tensors)`` of a little-endian GGUF file (v2 or v3): metadata key -> value, and per
    tensor ``(name, shape innermost first, ggml type, absolute data offset, bytes)``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        if buf[:4] != b"GGUF":
            raise ValueError("not a GGUF file (magic bytes)")
        cur.at = 4
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise UnsupportedHeader(f"GGUF version {version} (or a big-endian file)")
        num_tensors, num_kv = cur.unpack("<Q"), cur.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"))
        infos = []
        for _ in range(num_tensors):
            name = cur.string()
            dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
            infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        align = int(metadata.get("general.alignment", 32))
        data_start = -(-cur.at // align) * align
        tensors = []
        for name, dims, ttype, offset in infos:
            block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            num_bytes = int(np.prod(dims, dtype=np.int64)) // block * type_bytes
            tensors.append((name, dims, ttype, data_start + offset, num_bytes))
            if data_start + offset + num_bytes > len(buf):
                raise ValueError(f"tensor {name} runs past the end of the file")
    return metadata, tensors
