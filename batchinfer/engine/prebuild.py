"""Build the engine's C kernels for this CPU into the user's cache, once, at install (`make install` runs it).

A model's first load then compiles nothing: it finds every block type's GEMMs, the repack, attention and the norms
there (native_build.existing_library), where it would spend 3-6 s of gcc on two cores, most of a first run on an
empty model cache. Without it (a plain `pip install`) the first load builds what its model needs, as before.

    python -m batchinfer.engine.prebuild
"""
from __future__ import annotations

import time
from pathlib import Path

from .attention.cpu_backend import start_attention_build
from .layers.cpu_ops import start_ops_build
from .machine.native_build import NativeKernelUnavailable, user_cache
from .quant.kernel import TYPES, start_build, start_packer_build


def prebuild_kernels() -> list[Path]:
    """Every kernel this CPU runs, built side by side (each its own gcc), into user_cache()/kernels."""
    cache = str(user_cache())
    every = frozenset(TYPES)
    builds = [start_build(cache, every), start_packer_build(cache, every), start_attention_build(cache),
              start_ops_build(cache)]
    return [build.result() for build in builds]


def main() -> None:
    started = time.perf_counter()
    try:
        paths = prebuild_kernels()
    except (NativeKernelUnavailable, OSError) as e:  # no AVX2, no gcc or no writable cache: a first load builds
        print(f"C kernels not built: {e}")  # what it can then, and the install goes on
        return
    print(f"C kernels ready in {paths[0].parent} ({len(paths)} libraries, {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
