"""What runs beside Celery in a worker process: a thread that beats the worker's state into the
registry, steals a unit from a busy peer's queue when this worker sits idle, and reaps dead peers."""
from __future__ import annotations

import logging
import threading
from typing import Callable

import redis

from batchinfer.cluster.routing import SHARED_QUEUE
from batchinfer.cluster.registry import WorkerRegistry, WorkerState

log = logging.getLogger(__name__)


class WorkerAgent:
    def __init__(self, registry: WorkerRegistry, name: str, beat_s: float = 2.0, steal: bool = True,
                 reap: Callable[[], object] | None = None):
        self.registry = registry
        self.state = WorkerState(name)
        self.beat_s = beat_s
        self.steal = steal
        self.reap = reap
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> WorkerAgent:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="batchinfer-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """A clean shutdown: what is queued for this worker goes to the shared queue now, and it stays
        known as gone, so peers also drain anything the broker restores into its queue later."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.registry.drain(self.state.queue)
        self.registry.go_silent(self.state.name)

    def unit_started(self, unit_id: str) -> None:
        with self._lock:
            self.state.busy, self.state.unit_id = True, unit_id
        self.beat()  # at once: a reaper must know what this worker runs if it dies now

    def unit_finished(self, prefix_key: str = "", work_tokens: int = 0, seconds: float = 0.0) -> None:
        """work_tokens: uncached prompt plus completion tokens the unit computed, for plan estimates."""
        with self._lock:
            self.state.busy, self.state.unit_id = False, None
            self.state.ran(prefix_key)
            self.state.units_done += 1
            if work_tokens and seconds > 0:
                rate, old = work_tokens / seconds, self.state.prefill_tokens_per_s
                self.state.prefill_tokens_per_s = rate if old is None else 0.7 * old + 0.3 * rate
        self.beat()

    def beat(self) -> None:
        with self._lock:
            self.registry.beat(self.state)

    def tick(self) -> None:
        self.beat()
        if self.steal and not self.state.busy and self._nothing_queued_for_me():
            victim = self.registry.steal_one(self.state.name)
            if victim:
                log.info("idle: took a unit queued for busy worker %s", victim)
        if self.reap:
            self.reap()

    def _nothing_queued_for_me(self) -> bool:
        return self.registry.queue_depth(self.state.queue) == 0 and self.registry.queue_depth(SHARED_QUEUE) == 0

    def _loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.tick()
            except redis.RedisError:
                log.warning("registry unreachable; will retry", exc_info=True)
            except Exception:  # the agent must outlive any one failure of reaping
                log.exception("worker agent tick failed")
