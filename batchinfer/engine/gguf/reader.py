"""A GGUF file mapped read-only: its metadata and tensor table parsed once, each tensor a view of the mapping.

gguf's own GGUFReader builds a numpy view per array element (1.8 s for a 49k-token vocabulary); this reads
numeric arrays whole and string arrays only when asked (StringArray): the engine's start reads the config, and a
vocabulary decoded string by string was 0.1 s of every start's critical path. Only what the engine reads: no
writing.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
         10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
# ggml type numbers -> names (the ones a file may hold; the kernel reads a subset, gguf/tensors.py says which)
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
              19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
              27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


def _string_at(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    """The length-prefixed UTF-8 string at pos, and the position after it."""
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n


class StringArray(Sequence):
    """A metadata array of strings (a vocabulary, merges), decoded on first use; the parse only walks its lengths."""

    def __init__(self, buf: mmap.mmap, pos: int, count: int):
        self._buf, self._pos, self._count = buf, pos, count
        self._values: list[str] | None = None

    def _decoded(self) -> list[str]:
        if self._values is None:
            values, pos = [], self._pos
            for _ in range(self._count):
                value, pos = _string_at(self._buf, pos)
                values.append(value)
            self._values = values
        return self._values

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):  # type: ignore[override]
        return self._decoded()[i]

    def __eq__(self, other: object) -> bool:
        return self._decoded() == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]


class GGUFError(ValueError):
    """Not a GGUF file this reader understands (the reason is the message)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str  # ggml's name: "Q4_K", "F32", ...
    shape: tuple[int, ...]  # numpy order: rows first (GGUF lists the innermost dimension first)
    offset: int  # from the start of the file
    nbytes: int


def open_gguf(path: str | Path) -> GGUFFile:
    """The file parsed once per process while it is unchanged: the weight-format choice and the load both read it
    (~0.1 s a parse, on every start's critical path)."""
    st = os.stat(path)
    return _parsed(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a view of the mapping."""
        t = self.tensors[name]
        return self.bytes[t.offset:t.offset + t.nbytes]

    def array(self, name: str, first: int | None = None) -> np.ndarray:
        """An F32/F16/BF16 tensor as float32 (F32: a view, no copy); `first`: only that index of its first axis (one
        expert), converted alone."""
        t = self.tensors[name]
        raw, shape = self.raw(name), t.shape
        if first is not None:
            size = t.nbytes // shape[0]
            raw, shape = raw[first * size:(first + 1) * size], shape[1:]
        if t.type == "F32":
            return raw.view(np.float32).reshape(shape)
        if t.type == "F16":
            return raw.view(np.float16).astype(np.float32).reshape(shape)
        if t.type == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        raise GGUFError(f"{name} is {t.type}, not a float tensor")

    def _parse(self) -> None:
        buf = self._map
        if buf[:4] != MAGIC:
            raise GGUFError(f"{self.path.name} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise GGUFError(f"{self.path.name}: GGUF version {version} is not supported (2 or 3)")
        pos = 24
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.metadata[key], pos = self._value(kind, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            ne = struct.unpack_from(f"<{dims}Q", buf, pos)
            kind, offset = struct.unpack_from("<IQ", buf, pos + 8 * dims)
            pos += 8 * dims + 12
            infos.append((name, ne, kind, offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-pos // align) * align
        ends = sorted(o for *_, o in infos) + [len(buf) - start]
        for name, ne, kind, offset in infos:
            nbytes = ends[ends.index(offset) + 1] - offset if offset in ends else 0
            shape = tuple(int(d) for d in reversed(ne))
            self.tensors[name] = TensorInfo(name, GGML_TYPES.get(kind, f"type {kind}"), shape, start + offset,
                                            _tensor_bytes(GGML_TYPES.get(kind), shape, nbytes))

    def _string(self, pos: int) -> tuple[str, int]:
        return _string_at(self._map, pos)

    def _value(self, kind: int, pos: int) -> tuple[Any, int]:
        if kind == STRING:
            return self._string(pos)
        if kind in SCALARS:
            fmt = SCALARS[kind]
            return struct.unpack_from(fmt, self._map, pos)[0], pos + struct.calcsize(fmt)
        if kind != ARRAY:
            raise GGUFError(f"{self.path.name}: unknown metadata type {kind}")
        sub, count = struct.unpack_from("<IQ", self._map, pos)
        pos += 12
        if sub == STRING:
            start, unpack = pos, struct.Struct("<Q").unpack_from
            for _ in range(count):
                pos += 8 + unpack(self._map, pos)[0]
            return StringArray(self._map, start, count), pos
        if sub in NUMPY:
            dtype = np.dtype(NUMPY[sub])
            values = np.frombuffer(self._map, dtype=dtype, count=count, offset=pos)
            return values, pos + count * dtype.itemsize
        out = []
        for _ in range(count):
            value, pos = self._value(sub, pos)
            out.append(value)
        return out, pos


# bytes per block and weights per block, for the sizes of the types the engine reads (others: up to the next tensor)
_BLOCKS = {"F32": (4, 1), "F16": (2, 1), "BF16": (2, 1), "Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32),
           "Q5_1": (24, 32), "Q8_0": (34, 32), "Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256),
           "Q5_K": (176, 256), "Q6_K": (210, 256)}


def _tensor_bytes(kind: str | None, shape: tuple[int, ...], fallback: int) -> int:
    if kind not in _BLOCKS:
        return fallback
    size, per = _BLOCKS[kind]
    return int(np.prod(shape)) // per * size
