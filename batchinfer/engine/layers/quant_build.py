"""Compile quant_kernel.c once per machine and source, cache the shared library, load it with ctypes.

A plain C file with no torch headers builds in under a second with gcc. Its OpenMP calls go to the libgomp
torch already loaded (the same soname), so its threads are torch's threads, not a second pool.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ..cpuinfo import cpu_flags

SOURCE = Path(__file__).with_name("quant_kernel.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
CPU_FLAGS = ("avx2", "fma", "f16c")


class QuantKernelUnavailable(RuntimeError):
    """This machine cannot run the quantized kernel (no AVX2/FMA/F16C, or no C compiler)."""


def cpu_supported() -> bool:
    return all(flag in cpu_flags() for flag in CPU_FLAGS)


@lru_cache(maxsize=1)
def load_kernel(cache_dir: str) -> ctypes.CDLL:
    """The kernel library, built into cache_dir/kernels the first time (keyed by source and flags)."""
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    if not cpu_supported():
        raise QuantKernelUnavailable(f"the quantized kernel needs a CPU with {', '.join(CPU_FLAGS)}")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "kernels" / f"quant_kernel-{key}.so"
    if not path.exists():
        _compile(path)
    lib = ctypes.CDLL(str(path))
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.q4_1_linear.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, c_int]
    lib.q8_0_linear.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, c_int]
    lib.q4_1_linear.restype = lib.q8_0_linear.restype = None
    return lib


def _compile(path: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise QuantKernelUnavailable("the quantized kernel needs a C compiler (gcc) to build once")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise QuantKernelUnavailable(f"building the quantized kernel failed: {done.stderr.strip()[:300]}")
        os.replace(tmp, path)  # a concurrent builder's copy is as good as ours
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
