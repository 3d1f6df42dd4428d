"""The API's limits in this process: token buckets (a rate per key or client address) and counters of
requests in flight per key. The embedded server (one process) keeps them here; with Redis configured
every server shares them there (api/shared_limits.py) and falls back to these while Redis is down."""
from __future__ import annotations

import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from batchinfer.settings import Settings

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
        return self.wait_for(level)

    def take(self, name: str) -> int:
        """Take a token: 0, or (none left, nothing taken) the seconds until there is one."""
        now = time.monotonic()
        with self._lock:
            level = self._level(name, now)
            self._levels[name] = (level - 1 if level >= 1 else level, now)
            while len(self._levels) > _MAX_TRACKED:
                self._levels.popitem(last=False)
        return self.wait_for(level)

    def wait_for(self, level: float) -> int:
        """The whole seconds until a bucket at `level` holds a token (0: it holds one now)."""
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


@dataclass
class Ticket:
    """A request's place among its key's requests of one kind in flight; given back by Limits.leave."""
    kind: str
    name: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    shared: bool = False  # held in Redis (False: in this process)
    renewer: Any = None  # the task that keeps a shared place's lease alive


class Limits:
    """Every limit the guard applies, in this process. Async so that the shared ones (Redis) fit the same calls."""

    def __init__(self, settings: Settings):
        self.failures = Buckets(settings.api_auth_failures_per_min)
        self.requests = Buckets(settings.api_requests_per_min)
        self.in_flight = {"uploads": InFlight(settings.api_concurrent_uploads),
                          "estimates": InFlight(settings.api_concurrent_estimates)}

    def limit(self, kind: str) -> int:
        return self.in_flight[kind].limit

    async def auth_wait(self, address: str) -> int:
        """Seconds this address must wait after too many failed authentications (0: none)."""
        return self.failures.wait_s(address)

    async def auth_failed(self, address: str) -> None:
        self.failures.take(address)

    async def take(self, key_id: str) -> int:
        """One request of the key: 0, or the seconds until its rate allows one."""
        return self.requests.take(key_id)

    async def enter(self, kind: str, key_id: str) -> Ticket | None:
        """A place among the key's `kind` in flight, or None when they are all taken."""
        return Ticket(kind, key_id) if self.in_flight[kind].enter(key_id) else None

    async def leave(self, ticket: Ticket) -> None:
        self.in_flight[ticket.kind].leave(ticket.name)
