"""Finished requests of a running unit, kept as they finish (issue 41): every chunk_s, or once chunk_requests are
waiting, the finished requests not yet kept are written to a results file of their own and committed behind the
unit's fence (state.units.commit_chunk). A run that dies loses at most the requests since its last chunk; a rerun
of the unit, on any worker, runs only what no chunk holds; each request is still counted once.

The engine's thread only files results here (a lock and a dict); the watch's thread builds, writes and commits.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from batchinfer.context import AppContext
from batchinfer.engine.types import GenerationResult
from batchinfer.jobs import record_store
from batchinfer.jobs.records import RequestKey, UnitResult
from batchinfer.jobs.units.engine_requests import EngineRequests

log = logging.getLogger(__name__)
Build = Callable[[RequestKey, list[GenerationResult]], "UnitResult | None"]
# (chunk number, its results file, its records) -> how many it counted, None when the fence refused it
Commit = Callable[[int, str, dict[RequestKey, UnitResult]], "int | None"]


class UnitChunks:
    def __init__(self, ctx: AppContext, unit_id: str, attempt: int, engine: EngineRequests, build: Build):
        self.ctx, self.unit_id, self.attempt, self.engine, self.build = ctx, unit_id, attempt, engine, build
        self.every_s, self.max_requests = ctx.settings.chunk_s, ctx.settings.chunk_requests
        self.kept: set[RequestKey] = set()  # committed by a chunk of this run: the unit's end leaves them out
        self._lock = threading.Lock()
        self._parts: dict[RequestKey, list[GenerationResult]] = {}
        self._done: dict[RequestKey, list[GenerationResult]] = {}  # finished, not yet in a chunk
        self._seq = 0
        self._last = time.monotonic()
        self._refused = False  # the fence said no: another run owns the unit now, this one keeps nothing more
        self._not_before = 0.0  # after a failed try: storage or the database down must not hold the watch's thread

    def add(self, result: GenerationResult) -> None:
        """The engine's on_result: a request is filed once its every part has come."""
        key = self.engine.key_of(result).whole()
        with self._lock:
            parts = self._parts.setdefault(key, [])
            parts.append(result)
            if len(parts) == len(self.engine.ids[key]):
                self._done[key] = sorted(self._parts.pop(key), key=lambda r: self.engine.key_of(r).part or 0)

    def due(self) -> bool:
        with self._lock:
            waiting = len(self._done)
        now = time.monotonic()
        return not self._refused and waiting > 0 and now >= self._not_before and (
            waiting >= self.max_requests or now - self._last >= self.every_s)

    def commit_due(self, commit: Commit) -> None:
        """Write a chunk when one is due, and `commit` it (state.units.commit_chunk, with the run's live rows). A
        chunk that fails to store or commit stays waiting: the next try, or the unit's end, takes it."""
        if not self.due():
            return
        with self._lock:
            taken, self._done = self._done, {}
        records = {key: rec for key, found in sorted(taken.items()) if (rec := self.build(key, found)) is not None}
        try:
            if records:
                self._commit(records, commit)
        except BaseException:
            with self._lock:
                self._done.update(taken)
            self._not_before = time.monotonic() + max(self.every_s, 5.0)
            raise
        self._last = time.monotonic()

    def _commit(self, records: dict[RequestKey, UnitResult], commit: Commit) -> None:
        self._seq += 1
        key = record_store.store_results(self.ctx.storage, self.unit_id, self.attempt, records, chunk=self._seq)
        counted = commit(self._seq, key, records)
        if counted is None:
            self._refused = True
            log.warning("unit %s: another run owns it now; this run keeps no more chunks", self.unit_id)
            return
        self.kept.update(records)
        log.info("unit %s: chunk %d committed (%d requests)", self.unit_id, self._seq, counted)
