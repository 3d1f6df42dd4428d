"""In-process limits for one server: token buckets (a rate per key or client address) and counters of
requests in flight per key. Several servers each keep their own."""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

_MAX_TRACKED = 10_000  # keys or addresses remembered; the least recently seen are forgotten (a full bucket again)


class Buckets:
    """`per_min` tokens a minute for each name, up to `per_min` saved up."""

    def __init__(self, per_min: int):
        self.capacity, self.rate = float(per_min), per_min / 60.0
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _level(self, name: str, now: float) -> float:
        level, at = self._levels.pop(name, (self.capacity, now))
        return min(self.capacity, level + (now - at) * self.rate)

    def wait_s(self, name: str) -> int:
        """0 when a token is left, else the whole seconds until one is (for Retry-After); takes nothing."""
        with self._lock:
            level = self._level(name, time.monotonic())
            self._levels[name] = (level, time.monotonic())
        return self._wait(level)

    def take(self, name: str) -> int:
        """Take a token: 0, or (none left, nothing taken) the seconds until there is one."""
        now = time.monotonic()
        with self._lock:
            level = self._level(name, now)
            self._levels[name] = (level - 1 if level >= 1 else level, now)
            while len(self._levels) > _MAX_TRACKED:
                self._levels.popitem(last=False)
        return self._wait(level)

    def _wait(self, level: float) -> int:
        return 0 if level >= 1 else max(1, math.ceil((1 - level) / self.rate))


class InFlight:
    """At most `limit` requests of one kind in flight per key."""

    def __init__(self, limit: int):
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, name: str) -> bool:
        with self._lock:
            if self._counts.get(name, 0) >= self.limit:
                return False
            self._counts[name] = self._counts.get(name, 0) + 1
            return True

    def leave(self, name: str) -> None:
        with self._lock:
            left = self._counts.get(name, 1) - 1
            if left:
                self._counts[name] = left
            else:
                self._counts.pop(name, None)
