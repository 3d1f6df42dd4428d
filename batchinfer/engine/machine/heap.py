"""The process heap for a CPU engine step: freed memory kept for the next step, not handed back to the kernel.

A step allocates the same large tensors as the last (a 661-token prefill's gate_up output is 43 MB a layer);
glibc serves anything above its mmap threshold (at most 32 MB by default) with a fresh mmap and returns it on
free, so every layer pays page faults and the kernel's zeroing of pages. Raising the mmap and trim thresholds
keeps those blocks in the heap: on the 1B Q4_K_M shared-document job, 0.95 -> 0.50 s of system time and
324k -> 143k page faults for the whole process (docs/benchmarks.md). The peak is the same memory either way.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP_BYTES = 256 << 20  # blocks up to this size come from the heap; a heap top up to it is kept when freed


def keep_freed_memory(keep_bytes: int = KEEP_BYTES) -> bool:
    """Set glibc's thresholds for this process; False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, keep_bytes) == 1 and mallopt(M_TRIM_THRESHOLD, keep_bytes) == 1
    if not ok:
        log.debug("mallopt refused the heap thresholds")
    return ok
