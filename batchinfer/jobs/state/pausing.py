"""Pause and resume a job: while paused no new unit of it starts (dispatch plans only runnable jobs, and a unit that
starts skips a paused job's requests), units already running finish and count, and its completion window keeps
running (expire_overdue takes paused jobs too)."""
from __future__ import annotations

from typing import Callable

from sqlalchemy import exists

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, UnitStatus, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.error_codes import batch_not_found, cannot_pause, cannot_resume
from batchinfer.errors import JobConflict, JobNotFound, shown
from batchinfer.jobs.state import table as T


def pause(ctx: AppContext, job_id: str, now: float, visible: Callable[[Job], bool] = lambda job: True) -> None:
    """Pausing a paused job answers as it is. Requests planned into units that have not started go back to pending:
    those units start without them, and the job's next dispatch after its resume plans them again."""
    with transaction(ctx.sessions) as session:
        job = _locked(session, job_id, visible)
        if job.status == JobStatus.PAUSED:
            return
        if not T.PAUSE_JOB.allows(job.status):
            raise JobConflict(cannot_pause(job.status))
        T.apply(job, T.PAUSE_JOB, now)
        unstarted_unit = exists().where(WorkUnit.id == Request.unit_id, WorkUnit.status == UnitStatus.QUEUED)
        T.move(session, T.HOLD_PLANNED, Request.job_id == job_id, unstarted_unit, unit_id=None, unit_pos=None)


def resume(ctx: AppContext, job_id: str, visible: Callable[[Job], bool] = lambda job: True) -> None:
    """Back to in_progress (queued if no unit of it had started); its first start time is kept. Resuming a job that
    runs answers as it is."""
    with transaction(ctx.sessions) as session:
        job = _locked(session, job_id, visible)
        if job.status in JobStatus.RUNNABLE:
            return
        if not T.RESUME_STARTED.allows(job.status):
            raise JobConflict(cannot_resume(job.status))
        T.apply(job, T.RESUME_STARTED if job.in_progress_at is not None else T.RESUME_UNSTARTED)


def _locked(session, job_id: str, visible: Callable[[Job], bool]) -> Job:
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or not visible(job):
        raise JobNotFound(batch_not_found(shown(job_id)))
    return job
