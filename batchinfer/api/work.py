"""How the API hands work on: to Celery workers, or (embedded, no broker) to threads here: validations and
estimates shared fairly between keys, on workers through per-key queues in Redis (cluster.fair_queue) or here
on a pool (api.fair); embedded engine runs on one thread of their own.

The API never validates or runs a batch on a request thread: creating a batch answers at once.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from batchinfer.api.errors import APIError
from batchinfer.api.fair import FairPool
from batchinfer.cluster.fair_queue import open_fair_queue
from batchinfer.cluster.registry import WorkerState

from batchinfer.context import AppContext
from batchinfer.db.models import JobStatus
from batchinfer.errors import one_line
from batchinfer.jobs.intake.validate_job import ValidationDeferred, deferred_cause, validate_job
from batchinfer.jobs.state.intake import validation_lost
from batchinfer.runtime.embedded import run_pending
from batchinfer.runtime.preview import store_estimate

log = logging.getLogger(__name__)


class WorkQueue:
    def __init__(self, ctx: AppContext):
        self.ctx = ctx
        embedded = ctx.settings.embedded
        # embedded: units run one at a time, as on a worker, on a thread of their own; a validation or an
        # estimate never waits behind a run, nor behind another key's flood of them
        self._local = ThreadPoolExecutor(1, thread_name_prefix="batchinfer-embedded") if embedded else None
        threads = ctx.settings.api_work_threads
        # one key never holds every thread: another key's work starts at once, whatever the first has queued
        self._fair = FairPool(threads, max(1, threads - 1), name="batchinfer-validate") if embedded else None
        self._run_queued = False
        self._lock = threading.Lock()
        self._fair_queue = None if embedded else open_fair_queue(ctx.settings)

    def validate(self, job_id: str, owner: str = "") -> None:
        """Queue the validation of a new batch. If the broker is down the batch stays `validating`, marked so
        that the first sweep once the broker is back validates it (the batch is created: no error, which
        a client would retry into a second batch)."""
        if self._fair is not None:
            self._fair.submit(owner, lambda: self._validate_then_run(job_id))
            return
        try:
            self._to_workers(owner, {"kind": "validate", "job_id": job_id})
        except Exception as exc:
            log.warning("could not queue the validation of %s (%s); the sweep will validate it", job_id, one_line(exc))
            validation_lost(self.ctx, job_id)

    def _validate_then_run(self, job_id: str) -> None:
        try:
            if validate_job(self.ctx, job_id).status == JobStatus.QUEUED:
                self._run_soon()
        except ValidationDeferred as exc:  # kept `validating`: the sweep validates it again
            log.warning("%s (%s)", exc, deferred_cause(exc))

    def dispatch_soon(self) -> None:
        """Plan what a resumed batch has left: here when embedded, else a dispatch task (if the broker does not answer,
        the sweep dispatches pending work of a runnable batch after worker_ttl_s)."""
        if self._fair is not None:
            self._run_soon()
            return
        try:
            from workers.tasks import trigger_dispatch  # lazy: celery, which only the cluster mode needs

            trigger_dispatch()
        except Exception as exc:
            log.warning("could not ask for a dispatch (%s); the sweep will dispatch", one_line(exc))

    def _run_soon(self) -> None:
        """One run queued at most: a run dispatches everything queued when it starts."""
        assert self._local is not None
        with self._lock:
            if self._run_queued:
                return
            self._run_queued = True
        self._local.submit(self._run)

    def _run(self) -> None:
        with self._lock:
            self._run_queued = False
        try:
            run_pending(self.ctx)
        except Exception:
            log.exception("embedded run failed; the next run picks up what is left")

    def estimate(self, input_key: str, owner: str = "") -> str:
        """Start an estimate; its result appears in storage under runtime.preview.estimate_key(id)."""
        estimate_id = uuid.uuid4().hex
        if self._fair is not None:
            self._fair.submit(owner, lambda: store_estimate(self.ctx, estimate_id, input_key, [WorkerState("embedded")]))
        else:
            try:
                self._to_workers(owner, {"kind": "estimate", "estimate_id": estimate_id, "input_key": input_key,
                                         "posted_at": time.time()})
            except Exception as exc:
                log.warning("could not queue estimate %s (%s)", estimate_id, one_line(exc))
                raise APIError(503, "The broker does not answer, so the estimate cannot be made now; try again "
                                    "later.", "broker_unavailable") from None
        return estimate_id

    def _to_workers(self, owner: str, item: dict) -> None:
        """The item into its key's queue, and a message for a worker to take the next item of any key."""
        from workers.tasks import fair_work_task  # lazy: celery, which only the cluster mode needs

        assert self._fair_queue is not None
        self._fair_queue.push(owner, item)
        fair_work_task.apply_async()

    def close(self) -> None:
        if self._fair is not None:
            self._fair.close()
        if self._local is not None:
            self._local.shutdown(wait=False, cancel_futures=True)
