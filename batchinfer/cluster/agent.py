"""What runs beside Celery in a worker process: a thread that beats the worker's state into the
registry and steals a unit from a busy peer's queue when this worker sits idle, and a second that runs the
sweep when due (apart, so a sweep slowed by a service that is down never delays a beat)."""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Callable

import redis

from batchinfer.jobs.dispatch.routing import SHARED_QUEUE
from batchinfer.cluster.registry import WorkerRegistry, WorkerState
from batchinfer.errors import one_line
from batchinfer.jobs.faults import BROKER, is_transient

log = logging.getLogger(__name__)


class WorkerAgent:
    def __init__(self, registry: WorkerRegistry, name: str, beat_s: float = 2.0, steal: bool = True,
                 housekeeping: Callable[[], object] | None = None, model: str = "", model_path: str | None = None,
                 on_fault: Callable[[BaseException | None, str | None], object] | None = None,
                 max_loaded_adapters: int = 8):
        self.registry = registry
        self.max_loaded_adapters = max_loaded_adapters  # its engine's: how many adapters it reports as held
        self.state = WorkerState(name, incarnation=uuid.uuid4().hex, model=model, model_path=model_path)
        self.stopping = False  # set when the worker begins to shut down: an interrupted unit is rerun, not failed
        self.beat_s = beat_s
        self.steal = steal
        self.housekeeping = housekeeping  # the sweep, when one is due (it rate-limits itself)
        self.on_fault = on_fault  # told how each round went (an exception, or None): the outage board
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None

    def start(self) -> WorkerAgent:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="batchinfer-agent", daemon=True)
        self._thread.start()
        if self.housekeeping:  # its own thread: a sweep slowed by a service that is down never delays a beat
            self._sweeper = threading.Thread(target=self._sweep_loop, name="batchinfer-sweep", daemon=True)
            self._sweeper.start()
        return self

    def stop(self) -> None:
        """A clean shutdown: what is queued for this worker goes to the shared queue now, and it stays
        known as gone, so peers also drain anything the broker restores into its queue later."""
        self._stop.set()
        for thread in (self._thread, self._sweeper):
            if thread:
                thread.join(timeout=5)
        self.registry.drain(self.state.queue, self.state.pool_queue)
        self.registry.go_silent(self.state.name)

    def unit_started(self, unit_id: str) -> None:
        with self._lock:
            self.state.busy, self.state.unit_id = True, unit_id
        self._beat_now()  # at once: a reaper must know what this worker runs if it dies now

    def unit_finished(self, prefix_key: str = "", work_tokens: int = 0, seconds: float = 0.0,
                      adapters: Sequence[str] = ()) -> None:
        """work_tokens: uncached prompt plus completion tokens the unit computed, for plan estimates; adapters: the
        LoRA adapters its lines named, in order (routing prefers a worker holding an adapter loaded)."""
        with self._lock:
            self.state.busy, self.state.unit_id = False, None
            self.state.ran(prefix_key)
            self.state.ran_adapters(adapters, self.max_loaded_adapters)
            self.state.units_done += 1
            if work_tokens and seconds > 0:
                rate, old = work_tokens / seconds, self.state.prefill_tokens_per_s
                self.state.prefill_tokens_per_s = rate if old is None else 0.7 * old + 0.3 * rate
        self._beat_now()

    def _beat_now(self) -> None:
        """A beat from a unit's task: the broker down must not stop the unit (no sweep runs without it either,
        and the beat loop publishes this state once it is back)."""
        try:
            self.beat()
        except redis.RedisError as exc:
            log.warning("worker state not published (the broker is down: %s); the next beat publishes it", one_line(exc))

    def beat(self) -> None:
        with self._lock:
            self.registry.beat(self.state)

    def tick(self) -> None:
        self.beat()
        if self.steal and not self.stopping and not self.state.busy and self._nothing_queued_for_me():
            victim = self.registry.steal_one(self.state.name, self.state.model)
            if victim:
                log.info("idle: took a unit queued for busy worker %s", victim)

    def _nothing_queued_for_me(self) -> bool:
        return all(self.registry.queue_depth(q) == 0 for q in {self.state.queue, SHARED_QUEUE, self.state.pool_queue})

    def _loop(self) -> None:
        self._every(self.tick, "worker agent tick", BROKER)

    def _sweep_loop(self) -> None:
        assert self.housekeeping is not None
        self._every(self.housekeeping, "sweep", None)

    def _every(self, work: Callable[[], object], what: str, needs: str | None) -> None:
        """Run work every beat_s; tell on_fault how each round went (it answered: `needs` is up)."""
        while not self._stop.wait(self.beat_s):
            try:
                work()
            except Exception as exc:  # the agent must outlive any fault (Redis, database, storage down)
                if self.on_fault:
                    self.on_fault(exc, needs)
                if _transient(exc):
                    log.warning("%s: %s; will retry", what, one_line(exc))
                else:
                    log.exception("%s failed", what)
            else:
                if self.on_fault and needs:
                    self.on_fault(None, needs)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, redis.RedisError) or is_transient(exc)
