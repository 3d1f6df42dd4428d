"""Task entry points: each takes ids only, builds one command of batchinfer.runtime.commands and runs it."""
from __future__ import annotations

from batchinfer.cluster.broker import broker_priority
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE
from batchinfer.runtime.commands.dispatch_round import DispatchRound
from batchinfer.runtime.commands.run_unit import RunUnit
from batchinfer.runtime.commands.validate import Estimate, FairWork, ValidateJob
from batchinfer.settings import get_settings
from workers.celery_app import app
from workers.process import this_process

# task names stay as they were: messages already queued still run
DISPATCH_TASK, RUN_UNIT_TASK = "batchinfer.dispatch", "batchinfer.run_unit"
VALIDATE_TASK, ESTIMATE_TASK, FAIR_TASK = "batchinfer.validate_job", "batchinfer.estimate", "batchinfer.fair_work"


class CelerySender:
    """What the commands send, as task messages."""

    def unit(self, unit_id: str, queue: str, level: int | None = None, priority: int | None = None) -> None:
        if priority is None and level is not None:
            priority = broker_priority(level)
        run_unit_task.apply_async(args=[unit_id], queue=queue, priority=priority)

    def dispatch(self, round_no: int = 0, countdown: float | None = None) -> None:
        dispatch_task.apply_async(args=[round_no], queue=SHARED_QUEUE, countdown=countdown)

    def validation(self, job_id: str) -> None:
        validate_job_task.apply_async(args=[job_id], queue=SHARED_QUEUE)


SEND = CelerySender()


@app.task(name=DISPATCH_TASK)
def dispatch_task(round_no: int = 0) -> int:
    process = this_process()
    return DispatchRound(process.ctx, SEND, process.incarnation, round_no).run()


@app.task(name=RUN_UNIT_TASK, bind=True)
def run_unit_task(self, unit_id: str) -> dict:
    process = this_process()
    worker = (self.request.hostname or "worker").split("@")[0]
    priority = (self.request.delivery_info or {}).get("priority")
    return RunUnit(process.ctx, unit_id, worker, SEND, process.agent, process.incarnation, process.stopping,
                   priority, process.drain_at).run()


@app.task(name=VALIDATE_TASK)
def validate_job_task(job_id: str) -> str:
    return ValidateJob(this_process().ctx, job_id, SEND).run()


@app.task(name=ESTIMATE_TASK)
def estimate_task(estimate_id: str, input_key: str) -> str:
    return Estimate(this_process().ctx, estimate_id, input_key).run()


@app.task(name=FAIR_TASK)
def fair_work_task() -> str | None:
    return FairWork(this_process().ctx, SEND).run()


def trigger_dispatch(countdown: float | None = None) -> None:
    """Called after a submit: the short countdown lets concurrent submissions be planned together."""
    SEND.dispatch(0, get_settings().dispatch_countdown_s if countdown is None else countdown)


def stream_dispatch() -> None:
    """Asked by a validation once its first rows are committed (settings.stream_dispatch): a dispatch in rounds."""
    SEND.dispatch(0)
