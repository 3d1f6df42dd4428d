"""The integer kernel (qkernel.c): built once per machine, loaded with its C signatures, and its fastest exact path.

Every path gives the same bits (tests/engine/test_qkernel.py), so the path is a speed choice only: AMX where the
CPU has amx_int8 and Linux grants the tile state, else AVX-512 VNNI (on AMD's, VNNI_MUL: K-quant scales by vpmulld,
one pipelined uop there), else AVX2; the scalar reference for tests.
"""
from __future__ import annotations

import ctypes
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..machine.cpuinfo import cpu_flags, cpu_info
from ..machine.native_build import (CPU_FLAGS, NativeKernelUnavailable, built_library, compiler, cpu_supported,
                                   existing_library)

SOURCE = Path(__file__).with_name("qkernel.c")
UNITS = (SOURCE.with_name("qkernel_avx512.c"), SOURCE.with_name("qkernel_amx.c"))  # compiled beside it
REPACK_SOURCE = SOURCE.with_name("qrepack.c")
# the kernel's type numbers (qtypes.h), by GGML's names; SUPER: weights per (super-)block along K
TYPES = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q5_1": 3, "Q8_0": 4, "Q2_K": 5, "Q3_K": 6, "Q4_K": 7, "Q5_K": 8, "Q6_K": 9}
SUPER = {name: (256 if name.endswith("_K") else 32) for name in TYPES}
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q2_K": 84, "Q3_K": 110, "Q4_K": 144,
               "Q5_K": 176, "Q6_K": 210}
REFERENCE, AVX2, VNNI, AMX, VNNI_MUL = 0, 1, 2, 3, 4
PATH_NAMES = {REFERENCE: "scalar reference", AVX2: "AVX2", VNNI: "AVX-512 VNNI", AMX: "AMX int8",
              VNNI_MUL: "AVX-512 VNNI (vpmulld scales)"}
VNNI_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
# AMX from this many rows (measured on an AMX Xeon, one thread): below, VNNI's per-row dot products cost less
# than AMX's decode per call; 32-types scale every block's tile, so they gain later than K-quants
AMX_MIN_ROWS = {True: 8, False: 16}  # by K-quant


@dataclass(frozen=True)
class Kernel:
    lib: ctypes.CDLL
    path: int  # the fastest path this CPU runs
    types: frozenset[str] = frozenset(TYPES)  # the block types it has GEMMs for

    def path_for(self, rows: int, qtype: str) -> int:
        if qtype not in self.types:  # the C side would run it on the scalar reference: a loader's mistake
            raise ValueError(f"the integer kernel was built for {'/'.join(sorted(self.types))}, not {qtype}")
        return VNNI if self.path == AMX and rows < AMX_MIN_ROWS[qtype.endswith("_K")] else self.path

    @property
    def name(self) -> str:
        return PATH_NAMES[self.path]

    @property
    def paths(self) -> list[int]:
        """Every path this CPU runs, the reference first (tests compare them)."""
        return [REFERENCE, AVX2] + ([VNNI, VNNI_MUL] if self.path > AVX2 else []) + ([AMX] if self.path == AMX else [])


def supported() -> bool:
    return cpu_supported(CPU_FLAGS)


def best_path(lib: ctypes.CDLL) -> int:
    flags = cpu_flags()
    if not all(f in flags for f in VNNI_FLAGS):
        return AVX2
    if "amx_int8" in flags and "amx_tile" in flags and lib.amx_init() == 0:
        return AMX
    return VNNI_MUL if _amd() else VNNI


def _amd() -> bool:
    return cpu_info().get("vendor_id") == "AuthenticAMD"


_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qkernel-build")


def cpu_paths() -> int:
    """The vector paths this CPU takes, as QK_PATHS bits (qtypes.h): AVX2 alone, VNNI_MUL alone (AMD), or VNNI and
    AMX where it has them."""
    flags = cpu_flags()
    if not all(f in flags for f in VNNI_FLAGS):
        return 1
    if _amd():
        return 8
    return 2 | (4 if "amx_int8" in flags and "amx_tile" in flags else 0)


def _flags(types: frozenset[str] | None) -> tuple[str, ...]:
    """gcc's flags for `types` on this CPU's paths; for None, every type on every path (tests compare them)."""
    mask = sum(1 << TYPES[t] for t in types) if types else 0
    return ("-ffp-contract=off", *((f"-DQK_TYPES={mask}", f"-DQK_PATHS={cpu_paths()}") if mask else ()))


def start_build(cache_dir: str, types: frozenset[str] | None = None) -> Future:
    """Compile the kernel in the background (gcc runs beside the model's load); load_kernel waits for it. `types`:
    a model's own block types' GEMMs, on this CPU's paths only (a first load compiles about a fifth of the whole
    kernel), unless every type's is built already for this CPU (at install: prebuild.py); without, every type and
    path."""
    return _builds.submit(_built, SOURCE, UNITS, "integer kernel", cache_dir, types)


def available(cache_dir: str, types: frozenset[str]) -> bool:
    """Whether load_kernel(cache_dir, types) can have its library: built already (at install, or by an earlier
    load), or a C compiler to build it (a slim container may have none)."""
    return compiler() is not None or any(existing_library(SOURCE, cache_dir, extra=_flags(built), units=UNITS)
                                         for built in (frozenset(TYPES), types))


def _built(source: Path, units: tuple[Path, ...], what: str, cache_dir: str, types: frozenset[str] | None) -> Path:
    every = existing_library(source, cache_dir, extra=_flags(frozenset(TYPES)), units=units) if types else None
    return every or built_library(source, cache_dir, what, extra=_flags(types), units=units)


@lru_cache(maxsize=4)
def load_kernel(cache_dir: str, types: frozenset[str] | None = None) -> Kernel:
    """The kernel for this CPU (with every block type, or `types` only). Raises NativeKernelUnavailable without
    AVX2/FMA/F16C or a C compiler."""
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    if not supported():
        raise NativeKernelUnavailable(f"the integer kernel needs a CPU with {', '.join(CPU_FLAGS)}")
    lib = _with_repack(ctypes.CDLL(str(start_build(cache_dir, types).result())))
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.dequant_rows.argtypes = [c_int, ptr, i64, i64, ptr, i64, ptr, c_int]
    lib.dequant_packed.argtypes = [c_int, ptr, i64, i64, ptr]
    lib.quantize_acts.argtypes = [c_int, ptr, i64, i64, i64, i64, ptr, ptr, ptr, ptr, c_int]
    lib.gemm.argtypes = [c_int, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, ptr, i64, c_int, c_int]
    lib.linear.argtypes = [c_int, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, i64, c_int]
    lib.linear.restype = c_int
    lib.amx_init.restype = c_int
    for name in ("dequant_rows", "dequant_packed", "quantize_acts", "gemm"):
        getattr(lib, name).restype = None
    return Kernel(lib, best_path(lib), types or frozenset(TYPES))


@dataclass(frozen=True)
class Packer:
    """The repack alone (qrepack.c, 0.4 s of gcc for a model's types): a model's first load repacks the GGUF with
    it while the kernel's GEMMs compile (3-4 s of gcc); packed.py's packed_size and repack take it or a Kernel."""
    lib: ctypes.CDLL


_packer_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qrepack-build")


@lru_cache(maxsize=4)
def start_packer_build(cache_dir: str, types: frozenset[str] | None = None) -> Future:
    """`types`: a model's own block types' repack is specialized (the rest in one generic copy), as start_build."""
    return _packer_builds.submit(_built, REPACK_SOURCE, (), "integer kernel's repack", cache_dir, types)


@lru_cache(maxsize=4)
def load_packer(cache_dir: str, types: frozenset[str] | None = None) -> Packer:
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    return Packer(_with_repack(ctypes.CDLL(str(start_packer_build(cache_dir, types).result()))))


def _with_repack(lib: ctypes.CDLL) -> ctypes.CDLL:
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.repack.argtypes = [c_int, ptr, i64, i64, i64, ptr, ptr, c_int]
    lib.repack.restype = None
    lib.packed_bytes.argtypes = [c_int, i64, i64]
    lib.packed_bytes.restype = i64
    return lib
