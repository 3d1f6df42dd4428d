"""The invariance probe's answer kept on disk, keyed on everything that decides it, so a warm start skips it.

The row pad a GEMM library needs is a property of the library's kernel choice: the CPU (vendor, model, flags,
cache sizes: oneDNN and MKL block and dispatch on all of them), the torch build (its version and BLAS/oneDNN
configuration), the settings that steer ISA dispatch, the thread count, the weight shapes and dtype, and the
probe's own code. A change in any of them is another key, so the probe runs again there.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from ..machine.cpuinfo import cpu_info

log = logging.getLogger(__name__)

# Environment variables oneDNN, MKL and ATen read to pick (or cap) their instruction set or reproducibility mode.
DISPATCH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
                "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
# The probe and the code whose results it checks: editing any of them invalidates every cached answer.
PROBED_SOURCES = ("runner/invariance.py", "layers/linear.py", "attention/chunked.py", "runner/probe_cache.py")


def probe_key(shapes: list[tuple], head_dim: int, group: int) -> dict:
    """What decides the probe's answer, readable (it is stored beside the answer)."""
    return {"machine": machine_key(), "threads": torch.get_num_threads(),
            "shapes": sorted(repr(s) for s in shapes), "head_dim": head_dim, "group": group}


def cache_file(cache_dir: str | Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / "invariance" / f"row-pad-{digest}.json"


def load(path: Path, key: dict) -> dict | None:
    """The stored answer for exactly this key, else None (a missing, torn or foreign file is probed again)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("row_pad"), int) \
            or not isinstance(stored.get("max_rows"), int):
        return None
    return stored


def save(path: Path, key: dict, plan: tuple[int, int], invariant: bool) -> None:
    """Write beside the target and rename: a concurrent reader sees the whole file or none. A read-only
    cache is no error: the probe just runs again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as out:
            json.dump({"row_pad": plan[0], "max_rows": plan[1], "invariant": invariant, "key": key}, out, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not cache the invariance probe at %s: %s", path, exc)


@lru_cache(maxsize=1)
def machine_key() -> dict:
    return {"cpu": cpu_info(), "caches": _cache_sizes(), "torch": torch.__version__,
            "torch_config": hashlib.sha256(torch.__config__.show().encode()).hexdigest()[:16],
            "capability": torch.backends.cpu.get_cpu_capability(),
            "env": {name: os.environ[name] for name in DISPATCH_ENV if name in os.environ},
            "sources": _sources_digest()}


def _cache_sizes() -> list[str]:
    """cpu0's caches as `level type size` (sysfs), which oneDNN's blocking reads."""
    out = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            out.append(" ".join((index / name).read_text().strip() for name in ("level", "type", "size")))
        except OSError:
            continue
    return out


def _sources_digest() -> str:
    here = Path(__file__).parent.parent  # the engine package
    digest = hashlib.sha256()
    for name in PROBED_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]
