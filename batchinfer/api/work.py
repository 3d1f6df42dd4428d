"""How the API hands work on: to Celery workers, or (embedded, no broker) to one background thread here.

The API never validates or runs a batch on a request thread: creating a batch answers at once.
"""
from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

from batchinfer.context import AppContext
from batchinfer.db.models import JobStatus
from batchinfer.errors import one_line
from batchinfer.jobs.job_validation import ValidationDeferred, deferred_cause, validate_job
from batchinfer.jobs.state.validation import validation_lost

log = logging.getLogger(__name__)


class WorkQueue:
    def __init__(self, ctx: AppContext):
        self.ctx = ctx
        # embedded: one thread, so units run one at a time as on a worker
        self._local = ThreadPoolExecutor(1, thread_name_prefix="batchinfer-embedded") if ctx.settings.embedded else None

    def validate(self, job_id: str) -> None:
        """Queue the validation of a new batch. If the broker is down the batch stays `validating`, marked so
        that the first sweep once the broker is back validates it (the batch is created: no error, which
        a client would retry into a second batch)."""
        if self._local is not None:
            self._local.submit(self._validate_and_run, job_id)
            return
        from workers.tasks import validate_job_task

        try:
            validate_job_task.apply_async(args=[job_id])
        except Exception as exc:
            log.warning("could not queue the validation of %s (%s); the sweep will validate it", job_id, one_line(exc))
            validation_lost(self.ctx, job_id)

    def _validate_and_run(self, job_id: str) -> None:
        from batchinfer.runtime.embedded import run_pending

        try:
            if validate_job(self.ctx, job_id).status == JobStatus.QUEUED:
                run_pending(self.ctx)
        except ValidationDeferred as exc:  # kept `validating`: the sweep validates it again
            log.warning("%s (%s)", exc, deferred_cause(exc))
        except Exception:
            log.exception("embedded run of %s failed; the next run picks up what is left", job_id)

    def estimate(self, input_key: str) -> str:
        """Start an estimate; its result appears in storage under runtime.preview.estimate_key(id)."""
        estimate_id = uuid.uuid4().hex
        if self._local is not None:
            from batchinfer.runtime.preview import store_estimate

            from batchinfer.cluster.registry import WorkerState

            self._local.submit(store_estimate, self.ctx, estimate_id, input_key, [WorkerState("embedded")])
        else:
            from workers.tasks import estimate_task

            estimate_task.apply_async(args=[estimate_id, input_key])
        return estimate_id

    def close(self) -> None:
        if self._local is not None:
            self._local.shutdown(wait=False, cancel_futures=True)
