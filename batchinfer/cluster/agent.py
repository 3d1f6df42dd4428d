"""What runs beside Celery in a worker process: a thread that beats the worker's state into the
registry, steals a unit from a busy peer's queue when this worker sits idle, and runs the sweep when due."""
from __future__ import annotations

import logging
import threading
import uuid
from typing import Callable

import redis

from batchinfer.cluster.routing import SHARED_QUEUE
from batchinfer.cluster.registry import WorkerRegistry, WorkerState
from batchinfer.errors import one_line

log = logging.getLogger(__name__)


class WorkerAgent:
    def __init__(self, registry: WorkerRegistry, name: str, beat_s: float = 2.0, steal: bool = True,
                 housekeeping: Callable[[], object] | None = None, model: str = "", model_path: str | None = None):
        self.registry = registry
        self.state = WorkerState(name, incarnation=uuid.uuid4().hex, model=model, model_path=model_path)
        self.stopping = False  # set when the worker begins to shut down: an interrupted unit is rerun, not failed
        self.beat_s = beat_s
        self.steal = steal
        self.housekeeping = housekeeping  # the sweep, when one is due (it rate-limits itself)
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
        self.registry.drain(self.state.queue, self.state.pool_queue)
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
            victim = self.registry.steal_one(self.state.name, self.state.model)
            if victim:
                log.info("idle: took a unit queued for busy worker %s", victim)
        if self.housekeeping:
            self.housekeeping()

    def _nothing_queued_for_me(self) -> bool:
        return all(self.registry.queue_depth(q) == 0 for q in {self.state.queue, SHARED_QUEUE, self.state.pool_queue})

    def _loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.tick()
            except Exception as exc:  # the agent must outlive any fault (Redis, database, storage down)
                if _transient(exc):
                    log.warning("worker agent tick: %s; will retry", one_line(exc))
                else:
                    log.exception("worker agent tick failed")


def _transient(exc: BaseException) -> bool:
    from batchinfer.jobs.faults import is_transient

    return isinstance(exc, redis.RedisError) or is_transient(exc)
