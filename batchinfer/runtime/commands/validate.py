"""Work the API hands to workers: validate a stored batch, estimate a file, or take the next such item of the
key served longest ago (cluster.fair_queue)."""
from __future__ import annotations

import logging
import time

from redis.exceptions import RedisError

from batchinfer.cluster.fair_queue import open_fair_queue
from batchinfer.cluster.registry import open_registry
from batchinfer.context import AppContext
from batchinfer.db.models import JobStatus
from batchinfer.jobs.intake.validate_job import ValidationDeferred, deferred_cause, validate_job
from batchinfer.runtime.commands.sender import Sender
from batchinfer.runtime.preview import store_estimate

log = logging.getLogger(__name__)


class ValidateJob:
    """Validation off the API's request path (tokenizing needs the model's tokenizer, which workers hold), and of
    jobs the sweep found stuck in `validating`. Its first rows already ask for a dispatch round (streaming); once
    queued, the dispatch that plans the rest is asked for after a short countdown (concurrent submits together)."""

    def __init__(self, ctx: AppContext, job_id: str, sender: Sender):
        self.ctx, self.job_id, self.sender = ctx, job_id, sender

    def run(self) -> str:
        """The job's status after it."""
        try:
            status = validate_job(self.ctx, self.job_id, on_rows=self.sender.dispatch).status
        except ValidationDeferred as exc:  # kept `validating`: the sweep hands it on again once storage is back
            log.warning("%s (%s)", exc, deferred_cause(exc))
            return JobStatus.VALIDATING
        if status == JobStatus.QUEUED:
            self.sender.dispatch(0, self.ctx.settings.dispatch_countdown_s)
        return status


class Estimate:
    """The dry-run estimate of a stored file, written to storage for the API to read back."""

    def __init__(self, ctx: AppContext, estimate_id: str, input_key: str):
        self.ctx, self.estimate_id, self.input_key = ctx, estimate_id, input_key

    def run(self) -> str:
        store_estimate(self.ctx, self.estimate_id, self.input_key, open_registry(self.ctx.settings).live())
        return "estimated"


class FairWork:
    """One validation or estimate from the API, of the key served longest ago: the message names no item, so the
    order is decided now, when this worker is free."""

    def __init__(self, ctx: AppContext, sender: Sender):
        self.ctx, self.sender = ctx, sender

    def run(self) -> str | None:
        try:
            taken = open_fair_queue(self.ctx.settings).pop()
        except RedisError as exc:  # a validation left `validating` is redone by the sweep; an estimate's waiter times out
            log.warning("could not take work from the fair queue (%s)", type(exc).__name__)
            return None
        if taken is None:
            return None
        owner, item = taken
        if item["kind"] == "validate":
            return ValidateJob(self.ctx, item["job_id"], self.sender).run()
        if time.time() - item["posted_at"] > self.ctx.settings.api_estimate_wait_s:
            log.info("estimate %s of key %s dropped: its waiter has stopped waiting", item["estimate_id"], owner)
            return None
        return Estimate(self.ctx, item["estimate_id"], item["input_key"]).run()
