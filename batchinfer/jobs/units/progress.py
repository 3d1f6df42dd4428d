"""What a unit's run tells the rest while it runs: live counts, and which of its requests must stop.

A thread beside the engine does the talking, so the engine loop never waits on the database or storage.
Every `poll_s` it reads the status of the unit's jobs: a cancelling job's requests (or an expired job's)
are handed to the engine, which stops them before its next step and frees their KV blocks; then they are
closed in the database (cancelled or expired, counted as failed, behind the unit's attempt fence) and the
job's finalize is tried, so the job ends while the unit goes on with the other jobs' requests. Finished
requests are counted in memory and written as one small row per job at most every `flush_s`. When the worker
drains (SIGTERM) and its deadline passes, every request not yet finished is handed to the engine to stop: the
unit then commits what finished and gives the rest back (`drained`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Callable

from sqlalchemy import delete, insert, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, RequestStatus, UnitProgress, WorkUnit
from batchinfer.db.session import retrying
from batchinfer.engine.types import GenerationResult
from batchinfer.errors import one_line
from batchinfer.jobs import engine_rates
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import ending, units
from batchinfer.jobs.records import Counts, RequestKey, UnitRequest, UnitResult
from batchinfer.jobs.units.chunks import UnitChunks
from batchinfer.jobs.units.engine_requests import EngineRequests

log = logging.getLogger(__name__)


OnResult = Callable[[RequestKey, GenerationResult], None]
CHUNK_TICK_S = 0.25  # how often the chunks' thread looks whether a chunk is due


def _minus(t: Counts, kept: Counts | None) -> dict:
    have = asdict(t)
    return have if kept is None else {name: value - getattr(kept, name) for name, value in have.items()}


class UnitWatch:
    def __init__(self, ctx: AppContext, unit_id: str, attempt: int, requests: list[UnitRequest],
                 poll_s: float = 0.5, flush_s: float = 1.0, drain_at: Callable[[], float | None] = lambda: None):
        """drain_at: when the worker's engine must stop (time.time(); None: it is not draining)."""
        self.ctx, self.unit_id, self.attempt, self.drain_at = ctx, unit_id, attempt, drain_at
        self.drained = False  # the engine was told to stop the unit's unfinished requests: the worker drains
        self.chunks: UnitChunks | None = None  # finished requests committed as the unit runs (keep_chunks)
        self.engine = engine = EngineRequests(requests)
        self.poll_s, self.flush_s = poll_s, flush_s
        self.by_job: dict[str, list[RequestKey]] = defaultdict(list)
        for key in engine.ids:
            self.by_job[key.job_id].append(key)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tally: dict[str, Counts] = defaultdict(Counts)
        self._kept: dict[str, Counts] = defaultdict(Counts)  # of the tally, what chunks committed: not live any more
        self._write = threading.Lock()  # a flush and a chunk's commit write the live rows one at a time
        self._finished: set[str] = set()  # engine ids
        self._parts_left = {key: len(ids) for key, ids in engine.ids.items()}
        self._stopping: set[str] = set()  # engine ids handed to the engine (or about to be)
        self._to_abort: list[str] = []
        self._dirty = False
        self._flushed = False  # this run wrote live rows (finish deletes them)
        self._steps_before = None

    @contextmanager
    def watching(self, generator):
        """While the unit generates: the thread runs (and the chunks' own, apart: a chunk's write that waits on
        storage never delays a cancel or a drain). Both are joined before the unit commits, so every request
        stopped is closed in the database first, and every chunk is committed or left to the unit's end."""
        stats = getattr(generator, "step_stats", None)  # the engine measures its steps; the hf reference does not
        self._steps_before = stats.copy() if stats is not None else None
        loops = [self._loop] + ([self._chunk_loop] if self.chunks is not None else [])
        threads = [threading.Thread(target=loop, name=f"watch-{self.unit_id}", daemon=True) for loop in loops]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in threads:
                thread.join()

    # the engine's side (its thread) ------------------------------------------------------------------

    def keep_chunks(self, chunks: UnitChunks) -> None:
        self.chunks = chunks

    def listen(self, also: OnResult | None = None) -> Callable[[GenerationResult], None]:
        """on_result for the engine: counted here (and filed for the next chunk); a request done (every part of it)
        is passed on to `also` (a progress bar) with its key."""
        def on_result(result: GenerationResult) -> None:
            key = self._count(result)
            if self.chunks is not None:  # after the count: a chunk takes out of the live tally what is in it
                self.chunks.add(result)
            if key is not None and also is not None:
                also(key, result)
        return on_result

    def aborts(self) -> list[str]:
        """Request ids to stop now (asked before every engine step: a lock and a list, nothing more)."""
        with self._lock:
            ids, self._to_abort = self._to_abort, []
        return ids

    def _count(self, result: GenerationResult) -> RequestKey | None:
        """The request's key once its last part is done (None before, and for an aborted one)."""
        key = self.engine.key_of(result).whole()
        with self._lock:
            self._finished.add(result.request_id)
            self._parts_left[key] -= 1
            if result.aborted:
                return None
            t = self._tally[key.job_id]
            if self._parts_left[key] > 0:  # an embeddings line's part: its tokens, the request counts once done
                t.prompt_tokens += result.prompt_tokens
                return None
            if result.error:
                t.add(False)
            else:
                t.add(True, result.prompt_tokens, result.completion_tokens, result.cached_tokens)
            self._dirty = True
        return key

    # the watch's thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        polled = flushed = 0.0
        while not self._stop.wait(min(self.poll_s, self.flush_s) / 2):
            now = time.monotonic()
            if not self.drained and self._drain_due():
                self._drain()
            if now - polled >= self.poll_s:
                polled = now
                self._guarded(self._poll)
            if self._dirty and now - flushed >= self.flush_s:
                flushed = now
                self._guarded(self._flush)

    def _chunk_loop(self) -> None:
        while not self._stop.wait(CHUNK_TICK_S):
            self._guarded(self._keep_chunk)

    def _keep_chunk(self) -> None:
        assert self.chunks is not None
        self.chunks.commit_due(self._commit_chunk)

    def _commit_chunk(self, seq: int, result_key: str, records: dict[RequestKey, UnitResult]) -> int | None:
        """The chunk's counts and this run's live rows without them, in one transaction: status never counts a
        request twice, nor drops one."""
        with self._write:
            with self._lock:
                kept = {j: replace(c) for j, c in self._kept.items()}
                for key, rec in records.items():
                    kept.setdefault(key.job_id, Counts()).add(rec.ok, rec.prompt_tokens, rec.completion_tokens,
                                                              rec.cached_tokens)
                rows = self._rows(kept)
            counted = units.commit_chunk(self.ctx, self.unit_id, self.attempt, seq, result_key, records, rows)
            if counted is not None:
                with self._lock:
                    self._kept = defaultdict(Counts, kept)
                self._flushed = True
            return counted

    def _drain_due(self) -> bool:
        deadline = self.drain_at()
        return deadline is not None and time.time() >= deadline

    def _drain(self) -> None:
        """Stop every request the engine has not finished; they are given back at the commit, not closed here."""
        with self._lock:
            done = self._finished | self._stopping
            left = [i for ids in self.engine.ids.values() for i in ids if i not in done]
            self._stopping.update(left)
            self._to_abort += left
            self.drained = True
        log.warning("unit %s: the worker drains; %d requests stopped in the engine, given back to pending",
                    self.unit_id, len(left))

    def _flush(self) -> None:
        """Rewrite this run's rows (absolute figures: a retried write changes nothing), unless another run
        of the unit has started since."""
        with self._write:
            with self._lock:
                self._dirty = False
                rows = self._rows(self._kept)
            self._flushed = True

            def work(session) -> None:
                if session.scalar(select(WorkUnit.attempts).where(WorkUnit.id == self.unit_id)) != self.attempt:
                    return
                session.execute(delete(UnitProgress).where(UnitProgress.unit_id == self.unit_id))
                if rows:
                    session.execute(insert(UnitProgress), rows)

            retrying(self.ctx.sessions, work)

    def _rows(self, kept: dict[str, Counts]) -> list[dict]:
        """This run's live rows: what it finished that no chunk has committed (the caller holds the lock)."""
        now = time.time()
        return [{"unit_id": self.unit_id, "job_id": j, "attempt": self.attempt, **_minus(t, kept.get(j)), "updated_at": now}
                for j, t in sorted(self._tally.items())]

    def _poll(self) -> None:
        with self.ctx.sessions() as session:
            jobs = {j: (status, expires_at) for j, status, expires_at in session.execute(
                select(Job.id, Job.status, Job.expires_at).where(Job.id.in_(list(self.by_job))))}
        now = time.time()
        overdue = {j for j, (status, expires_at) in jobs.items() if expires_at < now and status in JobStatus.RUNNABLE}
        if overdue:
            ending.expire_overdue(self.ctx, now)  # their unstarted requests elsewhere too, once for all of them
        for job_id, keys in sorted(self.by_job.items()):
            if jobs.get(job_id, (None, now))[0] == JobStatus.CANCELLING:
                why = RequestStatus.CANCELLED
            elif job_id in overdue:
                why = RequestStatus.EXPIRED
            else:
                continue
            with self._lock:
                done = self._finished | self._stopping
                stop = {key: [i for i in self.engine.ids[key] if i not in done] for key in keys}
                stop = {key: ids for key, ids in stop.items() if ids}
                for ids in stop.values():
                    self._stopping.update(ids)
                    self._to_abort += ids
            if stop:
                self._close(job_id, sorted(stop), why)

    def _close(self, job_id: str, keys: list[RequestKey], why: str) -> None:
        """Close the job's requests this run holds as `why`, counted as failed, then try its finalize."""
        closed = units.stop_running(self.ctx, self.unit_id, self.attempt, job_id, [key.index for key in keys],
                                    expired=why == RequestStatus.EXPIRED)
        log.info("unit %s: %d requests of job %s stopped (%s)", self.unit_id, closed, job_id, why)
        try_finalize(self.ctx, job_id)

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
