"""What a unit's run tells the rest while it runs: live counts, and which of its requests must stop.

The engine asks `aborts()` before every step. At most every `poll_s` it reads the status of the unit's
jobs: a cancelling job's requests (or an expired job's) are closed in the database at once (cancelled or
expired, counted as failed, behind the unit's attempt fence), its finalize is tried, and their ids go back
to the engine, which frees their KV blocks. Other jobs' requests in the unit go on untouched.
Finished requests are counted in memory and written as one small row per job at most every `flush_s`.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select, update

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitProgress, UnitStatus, WorkUnit
from batchinfer.db.session import retrying
from batchinfer.engine.step_stats import StepStats
from batchinfer.engine.types import GenerationResult
from batchinfer.errors import one_line
from batchinfer.jobs import engine_rates, lifecycle
from batchinfer.jobs.records import UnitRequest

log = logging.getLogger(__name__)


@dataclass
class _Tally:
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class UnitWatch:
    ctx: AppContext
    unit_id: str
    attempt: int
    requests: list[UnitRequest]
    poll_s: float = 0.5
    flush_s: float = 1.0
    aborted: dict[str, str] = field(default_factory=dict)  # request id -> cancelled | expired
    _tally: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    _finished: set[str] = field(default_factory=set)
    _dirty: bool = False
    _polled_at: float = 0.0
    _flushed_at: float = 0.0
    _expires: dict[str, float] = field(default_factory=dict)

    _steps_before: StepStats | None = None

    def __post_init__(self):
        self._by_job: dict[str, list[UnitRequest]] = defaultdict(list)
        for r in self.requests:
            self._by_job[r.job_id].append(r)
        with self.ctx.sessions() as session:
            self._expires = {j: t for j, t in session.execute(select(Job.id, Job.expires_at).where(Job.id.in_(list(self._by_job))))}

    # the engine's side ------------------------------------------------------------------------------

    def on_result(self, result: GenerationResult) -> None:
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

    def aborts(self) -> list[str]:
        """Request ids to stop now (asked before every engine step; cheap unless a poll is due)."""
        now = time.monotonic()
        if self._dirty and now - self._flushed_at >= self.flush_s:
            self._flushed_at = now
            self._guarded(self.flush)
        if now - self._polled_at < self.poll_s:
            return []
        self._polled_at = now
        return self._guarded(self._poll) or []

    # the database's side ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Rewrite this run's rows (absolute figures: a retried write changes nothing), unless another run
        of the unit has started since."""
        self._dirty = False
        rows = [{"unit_id": self.unit_id, "job_id": j, "attempt": self.attempt, "completed": t.completed,
                 "failed": t.failed, "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
                 "cached_tokens": t.cached_tokens, "updated_at": time.time()} for j, t in sorted(self._tally.items())]

        def work(session) -> None:
            if session.scalar(select(WorkUnit.attempts).where(WorkUnit.id == self.unit_id)) != self.attempt:
                return
            session.execute(delete(UnitProgress).where(UnitProgress.unit_id == self.unit_id))
            if rows:
                session.execute(insert(UnitProgress), rows)

        retrying(self.ctx.sessions, work)

    def _poll(self) -> list[str]:
        with self.ctx.sessions() as session:
            status = {j: s for j, s in session.execute(select(Job.id, Job.status).where(Job.id.in_(list(self._by_job))))}
        now, stopped = time.time(), []
        for job_id, requests in sorted(self._by_job.items()):
            if status.get(job_id) == JobStatus.CANCELLING:
                why = RequestStatus.CANCELLED
            elif self._expires.get(job_id, now) < now and status.get(job_id) in JobStatus.RUNNABLE:
                lifecycle.expire_overdue(self.ctx)  # its unstarted requests elsewhere too
                why = RequestStatus.EXPIRED
            else:
                continue
            open_ = [r for r in requests if r.request_id not in self._finished and r.request_id not in self.aborted]
            if open_:
                self._close(job_id, open_, why)
                stopped += [r.request_id for r in open_]
        return stopped

    def _close(self, job_id: str, requests: list[UnitRequest], why: str) -> None:
        """Close the job's requests this run still holds as `why`, counted as failed, then try its finalize."""
        def work(session) -> int:
            session.execute(select(Job.id).where(Job.id == job_id).with_for_update())  # job rows first
            unit = session.get(WorkUnit, self.unit_id)
            if unit is None or unit.status != UnitStatus.RUNNING or unit.attempts != self.attempt:
                return 0
            closed = session.execute(update(Request).where(
                Request.job_id == job_id, Request.index.in_([r.request.index for r in requests]),
                Request.unit_id == self.unit_id, Request.status == RequestStatus.RUNNING).values(status=why)
                .execution_options(synchronize_session=False)).rowcount
            session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + closed))
            return closed

        closed = retrying(self.ctx.sessions, work)
        for r in requests:
            self.aborted[r.request_id] = why
        log.info("unit %s: %d requests of job %s stopped (%s)", self.unit_id, closed, job_id, why)
        lifecycle.try_finalize(self.ctx, job_id)

    def listen(self, also=None):
        """on_result for the engine: counted here, then passed on to `also` (a progress bar)."""
        def on_result(result: GenerationResult) -> None:
            self.on_result(result)
            if also is not None:
                also(result)
        return on_result

    def generation_starts(self, generator) -> None:
        stats = getattr(generator, "step_stats", None)  # the engine measures its steps; the hf reference does not
        self._steps_before = stats.copy() if stats is not None else None

    def finish(self, generator) -> None:
        """After the unit's commit: record the measured rates, and drop the live rows (the unit is done)."""
        stats = getattr(generator, "step_stats", None)
        if stats is not None and self._steps_before is not None:
            d = stats.since(self._steps_before)
            settings = self.ctx.settings
            self._guarded(lambda: engine_rates.record(self.ctx, settings.model_id, engine_rates.machine_name(),
                                                      d.prefill_tokens, d.prefill_s, d.decode_tokens, d.decode_s))
        self._guarded(lambda: retrying(self.ctx.sessions, lambda session: session.execute(
            delete(UnitProgress).where(UnitProgress.unit_id == self.unit_id, UnitProgress.attempt == self.attempt))))

    def _guarded(self, work):
        try:
            return work()
        except Exception as exc:  # the database is away: the unit goes on, the next poll tries again
            log.warning("unit %s: progress/abort poll failed: %s", self.unit_id, one_line(exc))
            return None
