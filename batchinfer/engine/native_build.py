"""Compile one of the engine's C kernels once per machine and source, cache the shared library, load it.

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
from pathlib import Path

from .cpuinfo import cpu_flags

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
CPU_FLAGS = ("avx2", "fma", "f16c")  # what FLAGS compile for


class NativeKernelUnavailable(RuntimeError):
    """This machine cannot run the C kernels (no AVX2/FMA/F16C, or no C compiler)."""


def cpu_supported() -> bool:
    return all(flag in cpu_flags() for flag in CPU_FLAGS)


def build_library(source: Path, cache_dir: str, what: str) -> ctypes.CDLL:
    """The library of `source`, built into cache_dir/kernels the first time (keyed by source and flags)."""
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    if not cpu_supported():
        raise NativeKernelUnavailable(f"the {what} needs a CPU with {', '.join(CPU_FLAGS)}")
    text = source.read_bytes()
    key = hashlib.sha256(text + " ".join(FLAGS).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "kernels" / f"{source.stem}-{key}.so"
    if not path.exists():
        _compile(source, path, what)
    return ctypes.CDLL(str(path))


def _compile(source: Path, path: Path, what: str) -> None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise NativeKernelUnavailable(f"the {what} needs a C compiler (gcc) to build once")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(source), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeKernelUnavailable(f"building the {what} failed: {done.stderr.strip()[:300]}")
        os.replace(tmp, path)  # a concurrent builder's copy is as good as ours
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
