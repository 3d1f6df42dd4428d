"""Compile one of the engine's C kernels once per machine and source, and cache the shared library.

A plain C file with no torch headers builds in under a second with gcc. Its OpenMP calls go to the libgomp
torch already loaded (the same soname), so its threads are torch's threads, not a second pool.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cpuinfo import cpu_flags

FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
AVX2 = ("-mavx2", "-mfma", "-mf16c")
AVX512 = (*AVX2, "-mavx512f")
CPU_FLAGS = ("avx2", "fma", "f16c")  # what AVX2 compiles for
AVX512_CPU_FLAGS = (*CPU_FLAGS, "avx512f")
SHARED_HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))  # what kernels include from here (cephes_exp.h)


class NativeKernelUnavailable(RuntimeError):
    """This machine cannot run the C kernels (no AVX2/FMA/F16C, or no C compiler)."""


def cpu_supported(needed: tuple[str, ...] = CPU_FLAGS) -> bool:
    return all(flag in cpu_flags() for flag in needed)


def avx512_supported() -> bool:
    return cpu_supported(AVX512_CPU_FLAGS)


def user_cache() -> Path:
    """The user's own cache, never a shared /tmp: its kernels/ holds what `python -m batchinfer.engine.prebuild`
    built at install (found before a model cache's own), and is where kernels build for an engine without one."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "batchinfer"


def _library(source: Path, isa: tuple[str, ...], extra: tuple[str, ...], units: tuple[Path, ...]) -> tuple[str, tuple[str, ...]]:
    """The library's file name, keyed by source, the headers beside it, the shared ones (SHARED_HEADERS) and the
    flags; and the flags."""
    flags = (*FLAGS, *isa, *extra)
    text = b"".join(f.read_bytes() for f in (source, *units))
    text += b"".join(h.read_bytes() for h in (*sorted(source.parent.glob("*.h")), *SHARED_HEADERS))
    return f"{source.stem}-{hashlib.sha256(text + ' '.join(flags).encode()).hexdigest()[:16]}.so", flags


def existing_library(source: Path, cache_dir: str, isa: tuple[str, ...] = AVX2, extra: tuple[str, ...] = (),
                     units: tuple[Path, ...] = ()) -> Path | None:
    """The library of these sources and flags if built already: at install (the user's cache) or in cache_dir."""
    return _found(_library(source, isa, extra, units)[0], cache_dir)


def _found(name: str, cache_dir: str) -> Path | None:
    return next((p for p in (user_cache() / "kernels" / name, Path(cache_dir) / "kernels" / name) if p.exists()), None)


def built_library(source: Path, cache_dir: str, what: str, isa: tuple[str, ...] = AVX2,
                  extra: tuple[str, ...] = (), units: tuple[Path, ...] = ()) -> Path:
    """The library of `source`, found built (existing_library) or built into cache_dir/kernels, not loaded: safe in
    a thread beside other work; the caller loads it with ctypes after importing torch (its libgomp must be loaded
    before ours resolves it). `units`: more C files linked in, each compiled in its own gcc beside the others (the
    cores share a long build)."""
    needed = AVX512_CPU_FLAGS if isa == AVX512 else CPU_FLAGS
    if not cpu_supported(needed):
        raise NativeKernelUnavailable(f"the {what} needs a CPU with {', '.join(needed)}")
    name, flags = _library(source, isa, extra, units)
    found = _found(name, cache_dir)
    if found is not None:
        return found
    path = Path(cache_dir) / "kernels" / name
    _compile((source, *units), path, what, flags)
    return path


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _compile(sources: tuple[Path, ...], path: Path, what: str, flags: tuple[str, ...]) -> None:
    cc = compiler()
    if cc is None:
        raise NativeKernelUnavailable(f"the {what} needs a C compiler (gcc) to build once")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as work:
        objects = [str(Path(work) / f"{s.stem}.o") for s in sources]
        jobs = [subprocess.Popen([cc, *flags, "-c", str(s), "-o", o], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for s, o in zip(sources, objects)]
        errors = [job.communicate()[1] for job in jobs]
        tmp = str(Path(work) / path.name)
        if all(job.returncode == 0 for job in jobs):
            linked = subprocess.run([cc, *flags, *objects, "-o", tmp], capture_output=True, text=True)
            errors.append(linked.stderr if linked.returncode else "")
        failed = next((e for job, e in zip(jobs, errors) if job.returncode), None) or (errors[-1] if len(errors) > len(jobs) else "")
        if failed or not os.path.exists(tmp):
            raise NativeKernelUnavailable(f"building the {what} failed: {failed.strip()[:300]}")
        os.replace(tmp, path)  # a concurrent builder's copy is as good as ours
