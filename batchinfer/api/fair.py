"""A fair share of the server's background work between keys: each key's validations and estimates wait in
their own queue, and a few threads serve the keys round-robin (next, the key whose work started longest ago;
a key new to the pool first), at most `per_key` of one key's items at once.
One key's flood then keeps at most `per_key` threads busy, and another key's one-line batch starts as soon as
a thread is free, whatever the flood left queued."""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

log = logging.getLogger(__name__)
Work = Callable[[], object]


class FairPool:
    def __init__(self, threads: int, per_key: int = 1, name: str = "batchinfer-fair"):
        self.per_key = per_key
        self._waiting: dict[str, deque[Work]] = {}  # keys with work not started
        self._running: dict[str, int] = {}
        self._served: dict[str, int] = {}  # when each key with work waiting or running last had an item started
        self._clock = 0
        self._cond = threading.Condition()
        self._closed = False
        for n in range(threads):
            threading.Thread(target=self._serve, name=f"{name}-{n}", daemon=True).start()

    def submit(self, key: str, work: Work) -> None:
        with self._cond:
            self._waiting.setdefault(key, deque()).append(work)
            self._cond.notify()

    def waiting(self, key: str) -> int:
        """Items of `key` not started yet."""
        with self._cond:
            return len(self._waiting.get(key, ()))

    def close(self) -> None:
        """Threads finish what they run and take nothing more; what waits is dropped (a validation left
        `validating` is picked up by the sweep, an estimate times out on its waiter)."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify_all()

    def _take(self) -> tuple[str, Work] | None:
        ready = [key for key in self._waiting if self._running.get(key, 0) < self.per_key]
        if not ready:
            return None
        key = min(ready, key=lambda k: self._served.get(k, -1))
        queue = self._waiting[key]
        work = queue.popleft()
        if not queue:
            del self._waiting[key]
        self._running[key] = self._running.get(key, 0) + 1
        self._clock += 1
        self._served[key] = self._clock
        return key, work

    def _serve(self) -> None:
        while True:
            with self._cond:
                taken = None if self._closed else self._take()
                while not self._closed and taken is None:
                    self._cond.wait()
                    taken = None if self._closed else self._take()
                if taken is None:
                    return
            key, work = taken
            try:
                work()
            except Exception:
                log.exception("background work of key %s failed", key)
            finally:
                with self._cond:
                    left = self._running[key] - 1
                    if left:
                        self._running[key] = left
                    else:
                        del self._running[key]
                        if key not in self._waiting:  # a key with nothing left is forgotten
                            del self._served[key]
                    self._cond.notify()
