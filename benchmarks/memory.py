"""Resident memory: a sampling thread records the high-water mark of one measured run."""
from __future__ import annotations

import os
import resource
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Context manager sampling this process's RSS every `interval_s`; `.peak_mib` after exit."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_bytes = max(self.peak_bytes, current_rss_bytes())
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, current_rss_bytes())

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


def process_max_rss_mib() -> float:
    """Lifetime RSS high-water of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_bytes() -> int:
    """Resident set size from /proc (Linux); the lifetime high-water mark elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
