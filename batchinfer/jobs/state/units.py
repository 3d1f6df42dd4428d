"""Moves of a work unit and the requests in it: plan, start, commit behind the fence, rerun or resend.

A unit can run twice (acks_late redelivers after a crash): the commit is a conditional UPDATE on the unit
row (the fence), so exactly one run counts its requests.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from sqlalchemy import and_, delete, exists, func, insert, or_, select, text, update

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, UnitChunk, UnitProgress, UnitStatus, WorkUnit
from batchinfer.db.session import retrying
from batchinfer.jobs import record_store
from batchinfer.jobs.records import COUNTERS, Counts, Origin, RequestKey, UnitResult
from batchinfer.jobs.state import error_rate
from batchinfer.jobs.state import table as T
from batchinfer.planner import UnitPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartedUnit:
    attempt: int
    to_run: dict[RequestKey, Origin]  # its requests still wanted (their job runnable, not cancelled)
    prefix_key: str


@dataclass(frozen=True)
class CommittedUnit:
    completed: int
    failed: int
    # jobs whose counts, after this commit, still leave requests open: no finalize to try for them yet
    unfinished_jobs: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()  # every job with a request in the unit (a cancelled one's too)
    given_back: int = 0  # its unfinished requests, back to pending (the worker drained)


PlannedUnit = tuple[str, UnitPlan, str, "str | None"]  # (unit id, plan, queue, model)


def plan_units(session, batch: list[PlannedUnit]) -> dict[str, int]:
    """Claim each plan's requests that are still pending in a runnable job (rows another dispatcher or a cancel
    holds are skipped) and record a unit over them; returns how many each unit holds (units that claimed none are
    not recorded). PostgreSQL: the whole batch in three statements (the units' INSERT, one SELECT FOR UPDATE SKIP
    LOCKED on arrays, one UPDATE), whatever its size: a statement a unit, with IN lists, cost a round trip each.
    The claim is the SELECT and the UPDATE, not one UPDATE over a locking subquery: planned on fresh statistics, that
    one can become a nested loop running the subquery once a row."""
    if session.get_bind().dialect.name != "postgresql":
        held = {unit_id: _plan_unit(session, unit_id, plan, queue, model) for unit_id, plan, queue, model in batch}
        return {unit_id: n for unit_id, n in held.items() if n}
    now = time.time()
    session.add_all([_new_unit(unit_id, plan, queue, model, len(plan.requests), now) for unit_id, plan, queue, model in batch])
    session.flush()
    wanted = {(r.job_id, r.index): (unit_id, pos) for unit_id, plan, _, _ in batch for pos, r in enumerate(plan.requests)}
    claimable = session.execute(_CLAIMABLE, {"_jobs": sorted({j for j, _ in wanted}), "_i": sorted({i for _, i in wanted}),
                                              "_pending": list(T.PLAN_REQUEST.current_states),
                                              "_runnable": list(T.UNIT_JOB_STATES)})
    claimed = sorted((j, i, *wanted[j, i]) for j, i in claimable if (j, i) in wanted)
    held = Counter(unit_id for _, _, unit_id, _ in claimed)
    moved = T.move_each(session, T.PLAN_REQUEST, claimed, ("unit_id", "unit_pos"))
    if moved != len(claimed):  # the rows it locked must all move: anything else rolls the batch back
        raise ClaimMismatch(f"a dispatch batch claimed {len(claimed)} requests but moved {moved}")
    for unit_id, plan, _, _ in batch:  # a request taken meanwhile (another dispatcher, a cancel): rare
        if held[unit_id] != len(plan.requests):
            session.execute(delete(WorkUnit).where(WorkUnit.id == unit_id) if not held[unit_id] else
                            update(WorkUnit).where(WorkUnit.id == unit_id).values(num_requests=held[unit_id]))
    return {unit_id: held[unit_id] for unit_id, _, _, _ in batch if held[unit_id]}


# one bound array a column (an IN list binds a parameter a value); `OF requests`: the job rows stay unlocked
_CLAIMABLE = text("SELECT requests.job_id, requests.index FROM requests JOIN jobs ON jobs.id = requests.job_id "
                  "WHERE requests.job_id = ANY(CAST(:_jobs AS varchar[])) AND requests.index = ANY(CAST(:_i AS integer[])) "
                  "AND requests.status = ANY(CAST(:_pending AS varchar[])) AND jobs.status = ANY(CAST(:_runnable AS varchar[])) "
                  "FOR UPDATE OF requests SKIP LOCKED")


def _new_unit(unit_id: str, plan: UnitPlan, queue: str, model: str | None, num_requests: int, now: float) -> WorkUnit:
    return WorkUnit(id=unit_id, status=T.PLAN_UNIT.next_state, queue=queue, prefix_key=plan.prefix_key, model=model,
                    adapter=plan.adapter or None, shared_prefix_len=plan.shared_prefix_len, num_requests=num_requests,
                    input_key=record_store.unit_input(unit_id), created_at=now, dispatched_at=now)


def _plan_unit(session, unit_id: str, plan: UnitPlan, queue: str, model: str | None = None) -> int:
    """One unit's claim (plan_units elsewhere than on PostgreSQL): the claimable rows first, then the move."""
    wanted = {(r.job_id, r.index): pos for pos, r in enumerate(plan.requests)}
    by_job: dict[str, list[int]] = defaultdict(list)
    for job_id, index in wanted:
        by_job[job_id].append(index)
    mine = or_(*(and_(Request.job_id == j, Request.index.in_(idx)) for j, idx in sorted(by_job.items())))
    rows = session.execute(select(Request.job_id, Request.index).join(Job, Job.id == Request.job_id)
                           .where(mine, Request.status.in_(T.PLAN_REQUEST.current_states),
                                  Job.status.in_(T.UNIT_JOB_STATES))
                           .with_for_update(of=Request, skip_locked=True))
    claimed = sorted(key for key in (tuple(row) for row in rows) if key in wanted)
    if not claimed:
        return 0
    session.add(_new_unit(unit_id, plan, queue, model, len(claimed), time.time()))
    session.flush()
    held = T.move_each(session, T.PLAN_REQUEST, [(j, i, wanted[j, i]) for j, i in claimed], ("unit_pos",),
                       unit_id=unit_id)
    if held < 0:
        held = session.scalar(select(func.count()).select_from(Request).where(Request.unit_id == unit_id))
    if held != len(claimed):  # SQLite locked no row: one moved meanwhile (a validation started over, a cancel)
        log.info("unit %s claimed %d requests, of which %d were still pending", unit_id, len(claimed), held)
        session.execute(delete(WorkUnit).where(WorkUnit.id == unit_id) if not held else
                        update(WorkUnit).where(WorkUnit.id == unit_id).values(num_requests=held))
    return held


class ClaimMismatch(RuntimeError):
    """A batch's claim did not move every request it locked (PostgreSQL): its transaction is rolled back, nothing
    planned."""


def requeue_orphans(ctx: AppContext, now: float, grace_s: float) -> int:
    """Requests of a stalled runnable job (queued over `grace_s` ago, some request planned or running, none of
    them in a queued or running unit) that no live unit holds (no unit, or a unit that finished without them over
    `grace_s` ago: a claim or a commit that went wrong) go back to pending, for the next dispatch; never failed.
    Such a state is never one a dispatcher or a commit leaves visible mid-way (each is one transaction). Jobs
    first: each sweep looks at a few job rows, not at every open request. A finished unit cannot commit again
    (the fence): nothing counts twice."""
    with ctx.sessions() as session:
        stalled = list(session.scalars(select(Job.id).where(
            Job.status.in_(JobStatus.RUNNABLE), Job.queued_at < now - grace_s, _open_rows(), ~_open_rows(live=True))))
    if not stalled:
        return 0
    unit_done = exists().where(WorkUnit.id == Request.unit_id, WorkUnit.status == UnitStatus.DONE,
                               WorkUnit.finished_at < now - grace_s)

    def work(session) -> int:
        return T.move(session, T.REQUEUE_ORPHAN, Request.job_id.in_(stalled), or_(Request.unit_id.is_(None), unit_done),
                      unit_id=None, unit_pos=None)

    moved = retrying(ctx.sessions, work)
    if moved:
        log.warning("%d requests were planned or running in no live unit: back to pending, dispatched again", moved)
    return moved


def _open_rows(live: bool = False):
    """Some request of the job is planned or running (in a queued or running unit, with `live`)."""
    held = exists().where(Request.job_id == Job.id, Request.status.in_(T.REQUEUE_ORPHAN.current_states))
    if live:
        held = held.where(WorkUnit.id == Request.unit_id, WorkUnit.status.in_((UnitStatus.QUEUED, UnitStatus.RUNNING)))
    return held


def start_unit(ctx: AppContext, unit_id: str, worker: str, incarnation: str | None = None) -> StartedUnit | None:
    """Mark the unit, its jobs and its still-wanted requests running; None when the unit is already done."""
    return retrying(ctx.sessions, lambda session: _start(session, unit_id, worker, incarnation, time.time()))


def _start(session, unit_id: str, worker: str, incarnation: str | None, now: float) -> StartedUnit | None:
    unit = session.get(WorkUnit, unit_id, with_for_update=True)
    if unit is None or not T.START_UNIT.allows(unit.status):
        return None
    T.apply(unit, T.START_UNIT)
    unit.started_at, unit.worker, unit.incarnation, unit.waiting_for = now, worker, incarnation, None
    unit.attempts += 1
    runnable = (select(Request.job_id, Request.index, Request.line, Request.custom_id, Job.status)
                .join(Job, Job.id == Request.job_id)
                .where(Request.unit_id == unit_id, Job.status.in_(T.UNIT_JOB_STATES),
                       Request.status.in_(T.RUN_REQUEST.current_states)))
    rows = session.execute(runnable).all()
    to_run = {RequestKey(j, i): Origin(line, custom_id) for j, i, line, custom_id, _ in rows}
    # no UPDATE for a job already in progress (every unit but its first): it never goes back. A validating one
    # still gets it: its queue move may commit meanwhile, and the UPDATE waits for that and then starts it
    for job_id in sorted({row.job_id for row in rows if row.status != JobStatus.IN_PROGRESS}):
        T.move(session, T.START_JOB, Job.id == job_id, now=now)
    # The state condition matters: a cancel that committed while this waited for the row keeps its
    # `cancelled` (already counted as failed); without it the request ran and was counted twice. One
    # statement a job, on its primary key (a plan on the status index, from stale statistics, scans the job).
    by_job: dict[str, list[int]] = defaultdict(list)
    for key in sorted(to_run):
        by_job[key.job_id].append(key.index)
    for job_id, indexes in by_job.items():
        T.move(session, T.RUN_REQUEST, Request.job_id == job_id, Request.index.in_(indexes), Request.unit_id == unit_id)
    return StartedUnit(unit.attempts, to_run, unit.prefix_key)


def open_requests(ctx: AppContext, unit_id: str) -> tuple[int, dict[RequestKey, Origin]] | None:
    """(attempts so far, requests not yet finished) of a unit that has not committed; None once it has."""
    with ctx.sessions() as session:
        unit = session.get(WorkUnit, unit_id)
        if unit is None or unit.status == UnitStatus.DONE:
            return None
        rows = session.execute(select(Request.job_id, Request.index, Request.line, Request.custom_id).where(
            Request.unit_id == unit_id, Request.status.in_(T.COMPLETE_REQUEST.current_states)))
        return unit.attempts, {RequestKey(j, i): Origin(line, custom_id) for j, i, line, custom_id in rows}


def commit_unit(ctx: AppContext, unit_id: str, result_key: str, records: dict[RequestKey, UnitResult],
                give_back: bool = False) -> CommittedUnit | None:
    """Count a run's results, if this run wins the fence; None when another run had already committed.
    give_back: the run was drained, so its requests with no record go back to pending, in the same transaction."""
    return retrying(ctx.sessions, lambda session: _commit(session, unit_id, result_key, records, give_back))


def _commit(session, unit_id: str, result_key: str, records: dict[RequestKey, UnitResult],
            give_back: bool = False) -> CommittedUnit | None:
    if not T.move(session, T.COMMIT_UNIT, WorkUnit.id == unit_id, result_key=result_key, finished_at=time.time(),
                  last_error=None):
        log.info("unit %s was already committed by another run; dropping this run's results", unit_id)
        return None
    held, still_open, records = _count(session, unit_id, records)
    unfinished = set(_counted(session, records))
    given_back = T.move(session, T.DRAIN_REQUEST, Request.unit_id == unit_id, unit_id=None, unit_pos=None) if give_back else 0
    n_ok = sum(1 for r in records.values() if r.ok)
    if given_back:  # their jobs cannot finish now: no finalize to try
        unfinished |= {key.job_id for key in still_open - set(records)}
    return CommittedUnit(completed=n_ok, failed=len(records) - n_ok, unfinished_jobs=frozenset(unfinished),
                         jobs=frozenset(j for j, _, _ in held), given_back=given_back)


def _count(session, unit_id: str, records: dict[RequestKey, UnitResult]):
    """Move the records' requests that are still open to completed or failed: (the unit's requests with their
    status before, the open ones, the records counted). A request cancelled meanwhile, or counted by a chunk of
    another run, stays so."""
    job_ids = sorted({key.job_id for key in records})
    if job_ids:
        session.execute(select(Job.id).where(Job.id.in_(job_ids)).order_by(Job.id).with_for_update())
    held = session.execute(select(Request.job_id, Request.index, Request.status).where(Request.unit_id == unit_id)).all()
    open_states = set(T.COMPLETE_REQUEST.current_states)
    still_open = {RequestKey(j, i) for j, i, status in held if status in open_states}
    records = {k: rec for k, rec in records.items() if k in still_open}
    for t, ok in ((T.COMPLETE_REQUEST, True), (T.FAIL_REQUEST, False)):
        batch = [(key.job_id, key.index, rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens)
                 for key, rec in sorted(records.items()) if rec.ok == ok]
        T.move_each(session, t, batch, ("prompt_tokens", "completion_tokens", "cached_tokens"))
    return held, still_open, records


def commit_chunk(ctx: AppContext, unit_id: str, attempt: int, seq: int, result_key: str,
                 records: dict[RequestKey, UnitResult], live_rows: list[dict]) -> int | None:
    """Count finished requests of a run that goes on, only while this attempt still owns the running unit (the
    fence: a run the sweep replaced, or one whose unit committed, counts nothing), and rewrite the run's live rows
    (unit_progress) without them in the same transaction. Returns how many it counted; None when refused."""
    def work(session) -> int | None:
        unit = session.get(WorkUnit, unit_id, with_for_update=True)
        if unit is None or unit.status != UnitStatus.RUNNING or unit.attempts != attempt:
            return None
        _, _, counted = _count(session, unit_id, records)
        _counted(session, counted)
        session.add(UnitChunk(unit_id=unit_id, attempt=attempt, seq=seq, result_key=result_key,
                              requests=len(counted), committed_at=time.time()))
        session.execute(delete(UnitProgress).where(UnitProgress.unit_id == unit_id))
        if live_rows:
            session.execute(insert(UnitProgress), live_rows)
        return len(counted)

    return retrying(ctx.sessions, work)


def _counted(session, records: dict[RequestKey, UnitResult]) -> frozenset[str]:
    """The records added to their jobs (locked by _count): counts, reasoning tokens, and a job past its
    max_error_rate stopped. Returns the jobs that still count fewer finished than total (_add_to_job_counts)."""
    unfinished = _add_to_job_counts(session, records)
    _add_reasoning(session, records)
    error_rate.stop_past_limit(session, sorted({key.job_id for key in records}))
    return unfinished


def _add_reasoning(session, records: dict[RequestKey, UnitResult]) -> None:
    """A thinking model's reasoning tokens into its jobs' usage (apart from Counts: live progress does not show them)."""
    by_job: dict[str, int] = defaultdict(int)
    for key, rec in records.items():
        by_job[key.job_id] += rec.reasoning_tokens
    for job_id, thought in sorted(by_job.items()):
        if thought:
            session.execute(update(Job).where(Job.id == job_id).values(reasoning_tokens=Job.reasoning_tokens + thought))


def _add_to_job_counts(session, records: dict[RequestKey, UnitResult]) -> frozenset[str]:
    """Add the records to their jobs' counts; returns the jobs that still count fewer finished than total (the
    counts are a hint: a finalize decides on the rows, and the sweep finalizes what a wrong hint skipped)."""
    totals: dict[str, Counts] = defaultdict(Counts)
    for key, rec in records.items():
        totals[key.job_id].add(rec.ok, rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens)
    unfinished = set()
    for job_id, added in sorted(totals.items()):
        counts = session.execute(update(Job).where(Job.id == job_id).values(
            **{name: getattr(Job, name) + getattr(added, name) for name in COUNTERS})
            .returning(Job.status, Job.total, Job.completed, Job.failed)).first()
        if counts is not None and (counts.status == JobStatus.VALIDATING  # streamed: no total yet, no finalize
                                   or counts.completed + counts.failed < counts.total):
            unfinished.add(job_id)
    return frozenset(unfinished)


def stop_running(ctx: AppContext, unit_id: str, attempt: int, job_id: str, indexes: list[int], expired: bool) -> int:
    """Close requests of `job_id` that this run of the unit holds and the engine stopped (cancel or expiry),
    counted as failed; only while this attempt still owns the unit. Returns how many were closed."""
    t = T.EXPIRE_RUNNING if expired else T.CANCEL_RUNNING

    def work(session) -> int:
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update())  # job rows first
        unit = session.get(WorkUnit, unit_id)
        if unit is None or unit.status != UnitStatus.RUNNING or unit.attempts != attempt:
            return 0
        closed = T.move(session, t, Request.job_id == job_id, Request.index.in_(indexes), Request.unit_id == unit_id)
        session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + closed))
        return closed

    return retrying(ctx.sessions, work)


def send_again(ctx: AppContext, unit_id: str, expect: str, attempts: int, cause: str) -> bool:
    """Put a lost unit (running nowhere, or queued with no message) back to queued, only if nothing moved it
    meanwhile (a commit, another sweep); True when this caller did and must send it."""
    t = T.RERUN_UNIT if expect == UnitStatus.RUNNING else T.RESEND_UNIT
    now = time.time()

    def claim(session) -> bool:
        return T.move(session, t, WorkUnit.id == unit_id, WorkUnit.attempts == attempts,
                      dispatched_at=now, last_error=cause[:1000]) == 1

    return retrying(ctx.sessions, claim)


def release_unit(ctx: AppContext, unit_id: str, attempt: int, service: str, cause: str) -> bool:
    """Put a running unit back to queued, unfinished, because `service` stayed down: its requests go back to
    planned (the completion window can expire them), and the run is not counted as a failure. Only while this
    attempt still owns the unit; True when it moved. The sweep sends it again once the service answers."""
    def work(session) -> bool:
        moved = T.move(session, T.RELEASE_UNIT, WorkUnit.id == unit_id, WorkUnit.attempts == attempt,
                       waiting_for=service, outage_releases=WorkUnit.outage_releases + 1, dispatched_at=time.time(),
                       last_error=cause[:1000])
        if moved:
            T.move(session, T.RELEASE_REQUEST, Request.unit_id == unit_id)
        return moved == 1

    return retrying(ctx.sessions, work)


def note_unit_error(ctx: AppContext, unit_id: str, cause: str) -> None:
    """Why a running unit's run did not commit (shown in its error lines if it fails for good)."""
    retrying(ctx.sessions, lambda session: session.execute(
        update(WorkUnit).where(WorkUnit.id == unit_id, WorkUnit.status == UnitStatus.RUNNING)
        .values(last_error=cause[:1000])), attempts=1)
