"""A small GGUF v3 reader for the exporter's tests (standard library only).

It parses what ``contract/scripted/gguf.py`` writes, independently of it: the header, every
KV pair (scalars, strings, arrays), the tensor infos and each tensor's bytes at its aligned
offset. Layout: gguf-py's ``gguf_reader.py`` / ``gguf_writer.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})
STRING, ARRAY = 8, 9
ELEMENT_BYTES = {0: 4, 30: 2}  # F32, BF16


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # innermost first, as stored
    kind: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufFile:
    version: int
    kv: dict[str, Any]
    kv_types: dict[str, int]
    tensors: dict[str, TensorInfo]
    data_start: int
    raw: bytes

    def tensor_bytes(self, name: str) -> bytes:
        info = self.tensors[name]
        size = ELEMENT_BYTES[info.kind]
        for dim in info.dims:
            size *= dim
        start = self.data_start + info.offset
        return self.raw[start : start + size]


class _Cursor:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.pos = 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        text = self.raw[self.pos : self.pos + length].decode("utf-8")
        self.pos += length
        return text

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind = self.take("<I")
            return [self.value(item_kind) for _ in range(self.take("<Q"))]
        return self.take(_SCALARS[kind])


def read_gguf(raw: bytes) -> GgufFile:
    """Parse a whole GGUF file held in memory."""
    cursor = _Cursor(raw)
    if raw[:4] != b"GGUF":
        raise ValueError(f"bad magic {raw[:4]!r}")
    cursor.pos = 4
    version = cursor.take("<I")
    num_tensors = cursor.take("<Q")
    num_kv = cursor.take("<Q")
    kv: dict[str, Any] = {}
    kv_types: dict[str, int] = {}
    for _ in range(num_kv):
        key = cursor.string()
        kind = cursor.take("<I")
        kv_types[key] = kind
        kv[key] = cursor.value(kind)
    tensors: dict[str, TensorInfo] = {}
    for _ in range(num_tensors):
        name = cursor.string()
        dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
        kind = cursor.take("<I")
        tensors[name] = TensorInfo(name, dims, kind, cursor.take("<Q"))
    alignment = kv.get("general.alignment", 32)
    data_start = cursor.pos + (-cursor.pos % alignment)
    return GgufFile(version, kv, kv_types, tensors, data_start, raw)
