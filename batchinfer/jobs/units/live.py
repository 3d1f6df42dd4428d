"""Live request counts: what running units report between commits, added to a job's committed counts.

A unit's run rewrites its unit_progress rows at most once a second (units.progress). Only rows of the
unit's current attempt while it runs count: a rerun's earlier attempt is ignored, and once the unit
commits (done) its figures are in the job's own counts, so the live figures settle onto the committed ones.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from sqlalchemy import func, select, true

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, UnitProgress, UnitStatus, WorkUnit
from batchinfer.jobs.records import COUNTERS, Counts
from batchinfer.jobs import outage


def _live_sums(*columns):
    p = UnitProgress
    return (select(*columns, *(func.sum(getattr(p, name)).label(name) for name in COUNTERS))
            .join(WorkUnit, WorkUnit.id == p.unit_id)
            .where(WorkUnit.status == UnitStatus.RUNNING, WorkUnit.attempts == p.attempt))


def live_counts(session, job_ids: list[str]) -> dict[str, Counts]:
    """Per job, its committed counts plus what its running units finished and have not committed yet, in one
    statement: one snapshot. Read apart, a chunk's commit between the two reads would drop its requests from
    both (the job read before it, the live rows after) or count them twice."""
    if not job_ids:
        return {}
    live = _live_sums(UnitProgress.job_id).where(UnitProgress.job_id.in_(job_ids)).group_by(UnitProgress.job_id).subquery()
    query = (select(Job.id, *(func.coalesce(getattr(Job, n), 0) + func.coalesce(getattr(live.c, n), 0) for n in COUNTERS))
             .outerjoin(live, live.c.job_id == Job.id).where(Job.id.in_(job_ids)))
    return {job_id: Counts(*(int(v) for v in rest)) for job_id, *rest in session.execute(query)}


def all_counts(session) -> Counts:
    """Every job's committed counts plus what running units finished since their last commit (for /metrics),
    in one statement for the same reason."""
    committed = select(*(func.coalesce(func.sum(getattr(Job, n)), 0) for n in COUNTERS)).subquery()
    live = _live_sums().subquery()
    query = (select(*(committed.c[i] + func.coalesce(live.c[n], 0) for i, n in enumerate(COUNTERS)))
             .select_from(committed).join(live, true()))  # one row each
    return Counts(*(int(v) for v in session.execute(query).one()))


def with_live(ctx: AppContext, jobs: list[Job]) -> list[Job]:
    """The jobs with their running units' figures added to their counts, and what services an unfinished one
    waits for (copies for display; never stored)."""
    running = [j.id for j in jobs if j.in_progress_at is not None and j.status not in JobStatus.TERMINAL]
    if running:
        with ctx.sessions() as session:
            live = live_counts(session, running)
        jobs = [_counted(job, live[job.id]) if job.id in live else job for job in jobs]
    return with_waiting(ctx, jobs)


def with_waiting(ctx: AppContext, jobs: list[Job]) -> list[Job]:
    """Unfinished jobs get `waiting_for` (services, sorted) and `waiting_since` while a service is down: one
    reported down (every unfinished batch needs all three), or one their released units wait for."""
    unfinished = [j.id for j in jobs if j.status not in JobStatus.TERMINAL]
    if not unfinished:
        return jobs
    down = outage.current(ctx)
    with ctx.sessions() as session:
        released = set(session.execute(select(Request.job_id, WorkUnit.waiting_for).join(WorkUnit, WorkUnit.id == Request.unit_id)
                                       .where(Request.job_id.in_(unfinished), WorkUnit.status == UnitStatus.QUEUED,
                                              WorkUnit.waiting_for.is_not(None)).distinct()))
    shown: list[Job] = []
    for job in jobs:
        services: set[str] = set(down) | {s for j, s in released if j == job.id and s} if job.id in unfinished else set()
        if not services:
            shown.append(job)
            continue
        copy = cast(SimpleNamespace, _copy(job))
        copy.waiting_for = sorted(services)
        copy.waiting_since = min((down[s].since for s in services if s in down), default=None)
        shown.append(cast(Job, copy))
    return shown


def _copy(job: Job):
    # a plain copy of the columns, not a Job: nothing shown here may ever reach the session
    if isinstance(job, SimpleNamespace):
        return job
    return SimpleNamespace(**{c.key: getattr(job, c.key) for c in Job.__mapper__.column_attrs})


def _counted(job: Job, counts: Counts) -> Job:
    shown = cast(Job, _copy(job))
    for name in COUNTERS:
        setattr(shown, name, getattr(counts, name))
    return shown
