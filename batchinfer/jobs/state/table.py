"""The transition table of jobs, requests and work units: each move names the states it may start from.

A move is applied as one conditional UPDATE (`move`): a row in any other state is left as it is and the
caller sees rowcount 0, so two processes racing for the same move cannot both make it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, or_, text, update

from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit

J, R, U = JobStatus, RequestStatus, UnitStatus
# jobs whose requests a unit may claim and run: a `validating` one only with streaming (settings.stream_dispatch:
# only then does a dispatch plan its rows); its results count only if its validation queues it
UNIT_JOB_STATES = (J.VALIDATING, J.QUEUED, J.IN_PROGRESS)
SUBJECTS: dict[str, Any] = {"job": Job, "request": Request, "unit": WorkUnit}


@dataclass(frozen=True)
class Transition:
    name: str
    subject: str  # job, request or unit
    current_states: tuple[str, ...]  # empty: the move creates the row
    next_state: str

    def allows(self, status: str) -> bool:
        return status in self.current_states


# jobs
CREATE_JOB = Transition("create", "job", (), J.VALIDATING)
QUEUE_JOB = Transition("queue (validation passed)", "job", (J.VALIDATING,), J.QUEUED)
FAIL_VALIDATION = Transition("fail validation", "job", (J.VALIDATING,), J.FAILED)
START_JOB = Transition("start (its first unit starts)", "job", (J.QUEUED,), J.IN_PROGRESS)
CANCEL_JOB = Transition("cancel", "job", (J.VALIDATING, J.QUEUED, J.IN_PROGRESS), J.CANCELLING)
FINALIZE_JOB = Transition("finalize (no request open)", "job", (J.QUEUED, J.IN_PROGRESS, J.CANCELLING), J.FINALIZING)
RETRY_FINALIZE = Transition("retry finalize (after its backoff)", "job", (J.FINALIZING,), J.FINALIZING)
COMPLETE_JOB = Transition("complete", "job", (J.FINALIZING,), J.COMPLETED)
EXPIRE_JOB = Transition("end expired", "job", (J.FINALIZING,), J.EXPIRED)
END_CANCELLED = Transition("end cancelled", "job", (J.FINALIZING,), J.CANCELLED)
FAIL_FINALIZE = Transition("fail (finalize kept failing)", "job", (J.FINALIZING,), J.FAILED)

# requests
ADD_REQUEST = Transition("add (a valid line)", "request", (), R.PENDING)
PLAN_REQUEST = Transition("plan into a unit", "request", (R.PENDING,), R.PLANNED)
RUN_REQUEST = Transition("run (its unit starts)", "request", (R.PLANNED, R.RUNNING), R.RUNNING)
COMPLETE_REQUEST = Transition("complete (its unit commits)", "request", (R.PLANNED, R.RUNNING), R.COMPLETED)
FAIL_REQUEST = Transition("fail (its unit commits an error)", "request", (R.PLANNED, R.RUNNING), R.FAILED)
CANCEL_UNSTARTED = Transition("cancel unstarted", "request", (R.PENDING, R.PLANNED), R.CANCELLED)
EXPIRE_UNSTARTED = Transition("expire unstarted", "request", (R.PENDING, R.PLANNED), R.EXPIRED)
CANCEL_ORPHANED = Transition("cancel orphaned (no unit runs it)", "request", (R.PENDING, R.PLANNED, R.RUNNING), R.CANCELLED)
EXPIRE_ORPHANED = Transition("expire orphaned (no unit runs it)", "request", (R.RUNNING,), R.EXPIRED)
# the unit's worker drains (SIGTERM): what it did not finish goes back to pending, not failed, for another worker
DRAIN_REQUEST = Transition("release (its worker drains)", "request", (R.RUNNING,), R.PENDING)
CANCEL_RUNNING = Transition("cancel running (the engine stopped it)", "request", (R.RUNNING,), R.CANCELLED)
EXPIRE_RUNNING = Transition("expire running (the engine stopped it)", "request", (R.RUNNING,), R.EXPIRED)
RELEASE_REQUEST = Transition("release (its unit waits out an outage)", "request", (R.RUNNING,), R.PLANNED)
# no live unit holds it (its unit is gone or finished without it): back to pending, for the next dispatch
REQUEUE_ORPHAN = Transition("requeue orphaned (no live unit holds it)", "request", (R.PLANNED, R.RUNNING), R.PENDING)

# work units
PLAN_UNIT = Transition("plan", "unit", (), U.QUEUED)
START_UNIT = Transition("start", "unit", (U.QUEUED, U.RUNNING), U.RUNNING)  # RUNNING: a redelivered message
COMMIT_UNIT = Transition("commit (the fence)", "unit", (U.QUEUED, U.RUNNING), U.DONE)
RERUN_UNIT = Transition("rerun (its worker is lost)", "unit", (U.RUNNING,), U.QUEUED)
RESEND_UNIT = Transition("resend (its message is lost)", "unit", (U.QUEUED,), U.QUEUED)
RELEASE_UNIT = Transition("release (a service it needs stayed down)", "unit", (U.RUNNING,), U.QUEUED)

TRANSITIONS = (CREATE_JOB, QUEUE_JOB, FAIL_VALIDATION, START_JOB, CANCEL_JOB, FINALIZE_JOB, RETRY_FINALIZE, COMPLETE_JOB,
               EXPIRE_JOB, END_CANCELLED, FAIL_FINALIZE, ADD_REQUEST, PLAN_REQUEST, RUN_REQUEST, COMPLETE_REQUEST,
               FAIL_REQUEST, CANCEL_UNSTARTED, EXPIRE_UNSTARTED, CANCEL_ORPHANED, EXPIRE_ORPHANED, DRAIN_REQUEST,
               CANCEL_RUNNING, EXPIRE_RUNNING, RELEASE_REQUEST, REQUEUE_ORPHAN, PLAN_UNIT, START_UNIT, COMMIT_UNIT,
               RERUN_UNIT, RESEND_UNIT, RELEASE_UNIT)


class Refused(Exception):
    """A move asked of a row that is not in one of the move's current states."""


def statement(t: Transition, *where, **values):
    """The conditional UPDATE of `t` (OR, not IN, over the states: an executemany cannot expand an IN)."""
    model = SUBJECTS[t.subject]
    in_state = or_(*(model.status == s for s in t.current_states))
    return (update(model).where(in_state, *where).values(status=t.next_state, **values)
            .execution_options(synchronize_session=False))


_TEXT_COLUMNS = {"unit_id"}  # per-row columns that are not integers


def move_each(session, t: Transition, rows: list[tuple], per_row: tuple[str, ...] = (), **values) -> int:
    """`t` on each request of `rows` ((job id, index, *one value per name in per_row)), setting those columns
    per row and `values` on all; returns how many moved. PostgreSQL: one UPDATE ... FROM unnest(arrays), the
    same statement text whatever the count (prepared once; an executemany costs a statement a row);
    elsewhere (SQLite) an executemany, whose count is not reliable on every driver: -1."""
    if not rows:
        return 0
    assert t.subject == "request"
    if session.get_bind().dialect.name == "postgresql":
        return session.execute(_unnest_update(t, per_row, tuple(sorted(values))),
                               {"_states": list(t.current_states), "_next": t.next_state, "_j": [r[0] for r in rows],
                                "_jobs": sorted({r[0] for r in rows}),
                                "_i": [r[1] for r in rows], **{f"_{n}": [r[2 + k] for r in rows] for k, n in enumerate(per_row)},
                                **{f"_v_{n}": v for n, v in values.items()}}).rowcount
    stmt = statement(t, Request.job_id == bindparam("_j"), Request.index == bindparam("_i"),
                     **{name: bindparam(f"_{name}") for name in per_row}, **values)
    session.connection().execute(stmt, [{"_j": r[0], "_i": r[1], **{f"_{n}": v for n, v in zip(per_row, r[2:])}}
                                        for r in rows])
    return -1


def _unnest_update(t: Transition, per_row: tuple[str, ...], fixed: tuple[str, ...]):
    sets = ", ".join(["status = :_next", *(f"{n} = given.{n}" for n in per_row), *(f"{n} = :_v_{n}" for n in fixed)])
    arrays = ", ".join(["CAST(:_j AS varchar[])", "CAST(:_i AS integer[])",
                        *(f"CAST(:_{n} AS {'varchar' if n in _TEXT_COLUMNS else 'integer'}[])" for n in per_row)])
    names = ", ".join(["j", "i", *per_row])
    # the ANY terms repeat the join: they give the planner the primary key's index on requests whatever the
    # statistics say (stale ones, from before a job's rows moved, made it scan the table once per statement)
    return text(f"UPDATE requests SET {sets} FROM unnest({arrays}) AS given({names}) "
                f"WHERE requests.job_id = given.j AND requests.index = given.i AND requests.status = ANY(:_states) "
                f"AND requests.job_id = ANY(CAST(:_jobs AS varchar[])) AND requests.index = ANY(CAST(:_i AS integer[]))")


def move(session, t: Transition, *where, **values) -> int:
    """Apply `t` to the rows matching `where` that are in one of its current states; returns how many moved.
    A job's `<state>_at` column is set to `now` when given."""
    now = values.pop("now", None)
    if now is not None and t.subject == "job":
        values[f"{t.next_state}_at"] = now
    return session.execute(statement(t, *where, **values)).rowcount


def apply(row, t: Transition, now: float | None = None) -> None:
    """Apply `t` to a row already loaded under its lock; raises Refused when its state does not allow it."""
    if not t.allows(row.status):
        raise Refused(f"{t.subject} {getattr(row, 'id', '')} is {row.status}: cannot {t.name}")
    row.status = t.next_state
    if now is not None and t.subject == "job":
        setattr(row, f"{t.next_state}_at", now)
