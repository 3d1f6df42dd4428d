"""What a unit's run tells the rest while it runs: live counts, and which of its requests must stop.

A thread beside the engine does the talking, so the engine loop never waits on the database or storage.
Every `poll_s` it reads the status of the unit's jobs: a cancelling job's requests (or an expired job's)
are handed to the engine, which stops them before its next step and frees their KV blocks; then they are
closed in the database (cancelled or expired, counted as failed, behind the unit's attempt fence) and the
job's finalize is tried, so the job ends while the unit goes on with the other jobs' requests. Finished
requests are counted in memory and written as one small row per job at most every `flush_s`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import delete, insert, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, RequestStatus, UnitProgress, WorkUnit
from batchinfer.db.session import retrying
from batchinfer.engine.types import GenerationResult
from batchinfer.errors import one_line
from batchinfer.jobs import engine_rates
from batchinfer.jobs.state import ending, units
from batchinfer.jobs.output.records import UnitRequest

log = logging.getLogger(__name__)


@dataclass
class _Tally:
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class UnitWatch:
    def __init__(self, ctx: AppContext, unit_id: str, attempt: int, requests: list[UnitRequest],
                 poll_s: float = 0.5, flush_s: float = 1.0):
        self.ctx, self.unit_id, self.attempt = ctx, unit_id, attempt
        self.poll_s, self.flush_s = poll_s, flush_s
        self.by_job: dict[str, list[UnitRequest]] = defaultdict(list)
        for r in requests:
            self.by_job[r.job_id].append(r)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tally: dict[str, _Tally] = defaultdict(_Tally)
        self._finished: set[str] = set()
        self._stopping: set[str] = set()  # handed to the engine (or about to be)
        self._to_abort: list[str] = []
        self._dirty = False
        self._flushed = False  # this run wrote live rows (finish deletes them)
        self._steps_before = None

    @contextmanager
    def watching(self, generator):
        """While the unit generates: the thread runs. It is joined before the unit commits, so every request
        it stopped is closed in the database first."""
        stats = getattr(generator, "step_stats", None)  # the engine measures its steps; the hf reference does not
        self._steps_before = stats.copy() if stats is not None else None
        thread = threading.Thread(target=self._loop, name=f"watch-{self.unit_id}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    # the engine's side (its thread) ------------------------------------------------------------------

    def listen(self, also=None):
        """on_result for the engine: counted here, then passed on to `also` (a progress bar)."""
        def on_result(result: GenerationResult) -> None:
            self._count(result)
            if also is not None:
                also(result)
        return on_result

    def aborts(self) -> list[str]:
        """Request ids to stop now (asked before every engine step: a lock and a list, nothing more)."""
        with self._lock:
            ids, self._to_abort = self._to_abort, []
        return ids

    def _count(self, result: GenerationResult) -> None:
        with self._lock:
            self._finished.add(result.request_id)
            if result.aborted:
                return
            t = self._tally[result.request_id.rsplit(":", 1)[0]]
            if getattr(result, "error", None):
                t.failed += 1
            else:
                t.completed += 1
                t.prompt_tokens += result.prompt_tokens
                t.completion_tokens += result.completion_tokens
                t.cached_tokens += result.cached_tokens
            self._dirty = True

    # the watch's thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        polled = flushed = 0.0
        while not self._stop.wait(min(self.poll_s, self.flush_s) / 2):
            now = time.monotonic()
            if now - polled >= self.poll_s:
                polled = now
                self._guarded(self._poll)
            if self._dirty and now - flushed >= self.flush_s:
                flushed = now
                self._guarded(self._flush)

    def _flush(self) -> None:
        """Rewrite this run's rows (absolute figures: a retried write changes nothing), unless another run
        of the unit has started since."""
        with self._lock:
            self._dirty = False
            rows = [{"unit_id": self.unit_id, "job_id": j, "attempt": self.attempt, "completed": t.completed,
                     "failed": t.failed, "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
                     "cached_tokens": t.cached_tokens, "updated_at": time.time()} for j, t in sorted(self._tally.items())]

        self._flushed = True

        def work(session) -> None:
            if session.scalar(select(WorkUnit.attempts).where(WorkUnit.id == self.unit_id)) != self.attempt:
                return
            session.execute(delete(UnitProgress).where(UnitProgress.unit_id == self.unit_id))
            if rows:
                session.execute(insert(UnitProgress), rows)

        retrying(self.ctx.sessions, work)

    def _poll(self) -> None:
        with self.ctx.sessions() as session:
            jobs = {j: (status, expires_at) for j, status, expires_at in session.execute(
                select(Job.id, Job.status, Job.expires_at).where(Job.id.in_(list(self.by_job))))}
        now = time.time()
        overdue = {j for j, (status, expires_at) in jobs.items() if expires_at < now and status in JobStatus.RUNNABLE}
        if overdue:
            ending.expire_overdue(self.ctx, now)  # their unstarted requests elsewhere too, once for all of them
        for job_id, requests in sorted(self.by_job.items()):
            if jobs.get(job_id, (None, now))[0] == JobStatus.CANCELLING:
                why = RequestStatus.CANCELLED
            elif job_id in overdue:
                why = RequestStatus.EXPIRED
            else:
                continue
            with self._lock:
                stop = [r for r in requests if r.request_id not in self._finished | self._stopping]
                self._stopping.update(r.request_id for r in stop)
                self._to_abort += [r.request_id for r in stop]
            if stop:
                self._close(job_id, stop, why)

    def _close(self, job_id: str, requests: list[UnitRequest], why: str) -> None:
        """Close the job's requests this run holds as `why`, counted as failed, then try its finalize."""
        closed = units.stop_running(self.ctx, self.unit_id, self.attempt, job_id, [r.request.index for r in requests],
                                    expired=why == RequestStatus.EXPIRED)
        log.info("unit %s: %d requests of job %s stopped (%s)", self.unit_id, closed, job_id, why)
        ending.try_finalize(self.ctx, job_id)

    # after the commit ------------------------------------------------------------------------------------

    def finish(self, generator) -> None:
        """Record the engine rates this unit measured, and drop the live rows (the unit is done)."""
        stats = getattr(generator, "step_stats", None)
        if stats is not None and self._steps_before is not None:
            steps = stats.since(self._steps_before)
            model, machine = self.ctx.settings.model_id, engine_rates.machine_name()
            self._guarded(lambda: engine_rates.record(self.ctx, model, machine, steps))
        if self._flushed:  # a unit shorter than flush_s wrote none: no round trip to drop them
            self._guarded(lambda: retrying(self.ctx.sessions, lambda session: session.execute(
                delete(UnitProgress).where(UnitProgress.unit_id == self.unit_id, UnitProgress.attempt == self.attempt))))

    def _guarded(self, work) -> None:
        try:
            work()
        except Exception as exc:  # the database is away: the unit goes on, the next round tries again
            log.warning("unit %s: progress/abort round failed: %s", self.unit_id, one_line(exc))
