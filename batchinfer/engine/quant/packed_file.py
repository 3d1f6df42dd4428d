"""Packed weights (quant/packed.py) in one cache file, built once and mapped after that: a GGUF's projections
(gguf/load.py), or a dense checkpoint's quantized to Q8_0 at load (quant/dense_q8_0.py).

Layout: 8 bytes of header length, a JSON header {tensor: [block type, rows, cols, offset, bytes]}, then each
tensor's packed panels at 64-byte aligned offsets. Built tensor by tensor into a mapped file whose pages are
written back and dropped as it goes, so the build's memory stays near one tensor, not the model, and the packed
blocks take the GGUF's own bytes (qtypes.h).
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .kernel import Kernel, Packer
from .packed import PackedWeight, packed_size, repack

VERSION = 2  # 2: K-quant scales packed as the file packs them (bump the cache keys that name it)
ALIGN = 64
SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start write-out of the range's dirty pages, do not wait


@dataclass(frozen=True)
class Source:
    """One tensor to pack: its block type, shape, its rows of GGUF blocks (made when packed), the row order."""
    name: str
    qtype: str
    n: int
    k: int
    blocks: Callable[[], np.ndarray]
    rows: np.ndarray | None = None
    done: Callable[[], None] = lambda: None  # after packing (the GGUF's pages of it are given back)


def packed_weights(sources: list[Source], kernel: Kernel, path: Path) -> dict[str, PackedWeight]:
    """Tensor name -> its packed weight, mapped from `path` (built first if missing)."""
    write_packed(sources, kernel, path)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapped, dtype=np.uint8)
    (size,) = struct.unpack_from("<Q", mapped, 0)
    header = json.loads(bytes(mapped[8:8 + size]))
    if header.pop("__version__", None) != VERSION:
        raise ValueError(f"{path} was written by another layout version; delete it to rebuild")
    return {name: PackedWeight(qtype, n, k, data[offset:offset + nbytes], kernel)
            for name, (qtype, n, k, offset, nbytes) in header.items()}


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_packed(sources: list[Source], packer: Kernel | Packer, path: Path) -> None:
    """The packed file at `path`, built if missing (by the kernel, or by a Packer while the kernel compiles)."""
    if not path.exists():
        build(sources, packer, path)


def build(sources: list[Source], kernel: Kernel | Packer, path: Path) -> None:
    sizes = {s.name: packed_size(kernel, s.qtype, s.n, s.k) for s in sources}
    widest = {s.name: [s.qtype, s.n, s.k, 10 ** 15, sizes[s.name]] for s in sources}  # no offset is longer
    offset = _aligned(8 + len(json.dumps(widest | {"__version__": VERSION})))
    entries: dict[str, tuple[str, int, int, int, int]] = {}
    for s in sources:
        entries[s.name] = (s.qtype, s.n, s.k, offset, sizes[s.name])
        offset = _aligned(offset + sizes[s.name])
    header = json.dumps(entries | {"__version__": VERSION}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.ftruncate(fd, offset)
        with mmap.mmap(fd, offset) as out:
            out[:8] = struct.pack("<Q", len(header))
            out[8:8 + len(header)] = header
            view = np.frombuffer(out, dtype=np.uint8)
            for source in sources:
                _, n, k, start, nbytes = entries[source.name]
                repack(kernel, source.qtype, source.blocks(), n, k, view[start:start + nbytes], source.rows)
                _write_back(fd, out, start, nbytes)
                drop(out, start, nbytes)
                source.done()
            del view
        os.fdatasync(fd)  # all of it on disk before the name points at it
        os.close(fd)
        fd = -1
        os.replace(tmp, path)  # a concurrent builder's file is as good as ours
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)


def quantize_q8_0(weight: np.ndarray) -> np.ndarray:
    """ggml's reference Q8_0 of a float32 [n, k] matrix, as rows of GGUF blocks."""
    from gguf import GGMLQuantizationType, quants  # lazy: gguf's numpy quantizer, while a cache file is built

    return quants.quantize(np.ascontiguousarray(weight, dtype=np.float32), GGMLQuantizationType.Q8_0)


def _write_back(fd: int, mapped: mmap.mmap, start: int, nbytes: int) -> None:
    """Start writing a range's pages to disk without waiting (Linux's sync_file_range; the build's fdatasync waits
    at the end): the disk writes one tensor while the next is repacked, where msync waited for each in turn
    (0.5-0.8 s of a 1B file's first load). Elsewhere, msync."""
    first = start - start % mmap.PAGESIZE
    start_write = _sync_file_range()
    if start_write is None or start_write(fd, first, nbytes + start - first, SYNC_FILE_RANGE_WRITE) != 0:
        mapped.flush(first, nbytes + start - first)


@lru_cache(maxsize=1)
def _sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def drop(mapped: mmap.mmap, start: int, nbytes: int) -> None:
    """Give a range's pages back (they stay in the page cache): the build's RSS stays near one tensor."""
    first = start - start % mmap.PAGESIZE
    try:
        mapped.madvise(mmap.MADV_DONTNEED, first, nbytes + start - first)
    except (OSError, ValueError):
        pass
