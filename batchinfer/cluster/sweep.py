"""The periodic sweep: the database is the truth, the broker is a hint. One pass makes them agree again.

Units running on a worker that is dead, restarted (another incarnation) or alive but running something
else are rerun; units past their time limit too; queued units with no message in the broker are sent
again; units released for an outage (jobs.outage) are sent again once a probe finds their service
answering; requests planned or running in no live unit go back to pending (never failed); pending requests
nobody dispatched are dispatched. Then the job-state half (jobs.lifecycle):
expiry, cancels, finalize and its retries. A unit that failed max_attempts times fails its requests;
runs released for an outage are not failures.

Every step is a conditional UPDATE, so a sweep that overlaps a worker's commit changes nothing it should
not; a rerun still commits behind the unit runner's fence, so nothing counts twice.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import exists, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.errors import one_line
from batchinfer.cluster.registry import WorkerRegistry, WorkerState
from batchinfer.jobs import lifecycle, outage
from batchinfer.jobs.state import units

log = logging.getLogger(__name__)


@dataclass
class SweepHooks:
    """What the sweep cannot do from this layer: send a unit, fail one for good, dispatch pending work, and
    validate a job again on a worker (None: in the sweep itself)."""
    requeue: Callable[[str], None]
    fail: Callable[[str, str], object]
    dispatch: Callable[[], object]
    revalidate: Callable[[str], object] | None = None


@dataclass(frozen=True)
class Lost:
    """A unit to send again: its attempts (the compare-and-set), the runs that count as failures, and why."""
    unit_id: str
    attempts: int
    failures: int
    cause: str
    released_for: str | None = None  # a run gave up on this service (outage): released, not rerun


@dataclass
class Sweep:
    rerun: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dispatched: bool = False
    requeued: int = 0  # requests planned or running in no live unit, put back to pending
    jobs: lifecycle.JobSweep | None = None


def maybe_sweep(ctx: AppContext, registry: WorkerRegistry, hooks: SweepHooks) -> Sweep | None:
    """Sweep when one is due (every sweep_interval_s across all workers) and no other sweep runs."""
    if not registry.due("sweep", ctx.settings.sweep_interval_s):
        return None
    # held no longer than a dead worker takes to be noticed: a worker killed mid-sweep must not stall
    # recovery; two sweeps that overlap after that are still safe (every step is a conditional UPDATE)
    lock = registry.lock("sweep-lock", max(ctx.settings.worker_ttl_s, 2 * ctx.settings.sweep_interval_s))
    if not lock.acquire():
        return None
    try:
        return sweep(ctx, registry, hooks)
    finally:
        try:
            lock.release()
        except Exception:  # expired or Redis gone: the lock times out by itself
            pass


def sweep(ctx: AppContext, registry: WorkerRegistry, hooks: SweepHooks, now: float | None = None) -> Sweep:
    now = now or time.time()
    done = Sweep()
    _drain_dead_queues(registry)
    for lost in _lost_units(ctx, registry, now):
        if lost.released_for is not None:
            _release(ctx, registry, lost)
        else:
            _rerun(ctx, hooks, lost, done, expect=UnitStatus.RUNNING)
    answering = _probe_outages(ctx)
    for unsent in _unsent_units(ctx, registry, now, answering):
        _rerun(ctx, hooks, unsent, done, expect=UnitStatus.QUEUED)
    done.requeued = units.requeue_orphans(ctx, now, ctx.settings.worker_ttl_s)
    if _undispatched(ctx, now):
        hooks.dispatch()
        done.dispatched = True
    done.jobs = lifecycle.sweep_jobs(ctx, now, hooks.revalidate)
    if done.rerun or done.resent or done.failed:
        log.warning("sweep: %d units rerun, %d sent again, %d failed for good", len(done.rerun), len(done.resent),
                    len(done.failed))
    return done


def _drain_dead_queues(registry: WorkerRegistry, forget_after_s: float = 3600.0) -> None:
    for dead in registry.dead():
        if registry.drain(dead.queue, dead.pool_queue):
            log.warning("worker %s is gone: its queued units moved to %s", dead.name, dead.pool_queue)
        if time.time() - dead.beat_at > forget_after_s:
            registry.forget(dead.name)


def _live(registry: WorkerRegistry) -> dict[str, WorkerState]:
    return {w.name: w for w in registry.live()}


def _lost_units(ctx: AppContext, registry: WorkerRegistry, now: float) -> list[Lost]:
    """Each unit marked running that nothing runs any more. The registry is read after the database: a
    worker publishes a unit before it marks it running, so a fresh start is seen."""
    with ctx.sessions() as session:
        rows = list(session.execute(select(WorkUnit.id, WorkUnit.worker, WorkUnit.incarnation, WorkUnit.attempts,
                                           WorkUnit.outage_releases, WorkUnit.started_at)
                                    .where(WorkUnit.status == UnitStatus.RUNNING)))
    if not rows:
        return []
    live = _live(registry)
    lost = []
    for unit_id, worker, incarnation, attempts, releases, started_at in rows:
        state = live.get(worker or "")
        if state is None:
            why = f"worker {worker} stopped beating"
        elif incarnation and state.incarnation and state.incarnation != incarnation:
            why = f"worker {worker} restarted"
        elif state.unit_id != unit_id:
            note = registry.released(unit_id)
            if note is not None and note[0] == attempts:  # its run gave up on an outage while the database was down
                lost.append(Lost(unit_id, attempts, attempts - releases, f"waiting for {note[1]}", note[1]))
                continue
            why = f"worker {worker} is not running it"
        elif started_at is not None and now - started_at > ctx.settings.unit_time_limit_s:
            why = f"past its time limit of {ctx.settings.unit_time_limit_s} s"
        else:
            continue
        lost.append(Lost(unit_id, attempts, attempts - (releases or 0), why))
    return lost


def _probe_outages(ctx: AppContext) -> set[str]:
    """Services that units were released for, or that someone reported down: which of them answer now (each
    probe also renews or ends the report that `status` shows)."""
    with ctx.sessions() as session:
        waited = set(session.scalars(select(WorkUnit.waiting_for).where(WorkUnit.status == UnitStatus.QUEUED,
                                                                        WorkUnit.waiting_for.is_not(None)).distinct()))
    services = {s for s in waited | set(outage.current(ctx)) if s}
    return {s for s in sorted(services) if outage.probe(ctx, s)}


def _unsent_units(ctx: AppContext, registry: WorkerRegistry, now: float, answering: set[str]) -> list[Lost]:
    """Queued units older than the grace period with no message in the broker (Redis lost it), and units
    released for an outage, as soon as their service answers (no grace: nobody sent them)."""
    grace = ctx.settings.worker_ttl_s
    with ctx.sessions() as session:
        rows = list(session.execute(select(WorkUnit.id, WorkUnit.attempts, WorkUnit.outage_releases, WorkUnit.waiting_for,
                                           WorkUnit.dispatched_at, WorkUnit.created_at)
                                    .where(WorkUnit.status == UnitStatus.QUEUED)))
    released = [Lost(u, a, a - (r or 0), f"{w} answers again") for u, a, r, w, _, _ in rows if w and w in answering]
    stale = [Lost(u, a, a - (r or 0), "no message for it in the broker") for u, a, r, w, sent, created in rows
             if not w and now - (sent or created) > grace]
    # A live dispatcher may still be sending them (planning 50,000 requests outlasts the grace): not lost
    if stale and registry.dispatching():
        stale = []
    if not (stale or released):
        return []
    present = registry.queued_unit_ids() | {w.unit_id for w in _live(registry).values() if w.unit_id}
    return [lost for lost in released + stale if lost.unit_id not in present]


def _undispatched(ctx: AppContext, now: float) -> bool:
    """Pending requests of a runnable job queued a while ago: the dispatch after its submit was lost."""
    grace = ctx.settings.worker_ttl_s
    pending = exists().where(Request.job_id == Job.id, Request.status == RequestStatus.PENDING)
    with ctx.sessions() as session:
        return bool(session.scalar(select(exists().where(Job.status.in_(JobStatus.RUNNABLE), pending,
                                                         Job.queued_at < now - grace))))


def _rerun(ctx: AppContext, hooks: SweepHooks, lost: Lost, done: Sweep, expect: str) -> None:
    unit_id = lost.unit_id
    if lost.failures >= ctx.settings.unit_max_attempts:
        try:
            if hooks.fail(unit_id, lost.cause):
                done.failed.append(unit_id)
        except Exception as exc:  # storage still down (its error lines go there): the next sweep tries again
            log.warning("unit %s: could not fail it yet: %s", unit_id, one_line(exc))
        return
    if units.send_again(ctx, unit_id, expect, lost.attempts, lost.cause):
        log.warning("unit %s: %s; sending it again", unit_id, lost.cause)
        hooks.requeue(unit_id)
        (done.rerun if expect == UnitStatus.RUNNING else done.resent).append(unit_id)


def _release(ctx: AppContext, registry: WorkerRegistry, lost: Lost) -> None:
    """The release a run left in the broker (the database was down then), written now: not a failure."""
    assert lost.released_for is not None
    if units.release_unit(ctx, lost.unit_id, lost.attempts, lost.released_for, lost.cause):
        outage.count_release(ctx, lost.released_for)
        log.warning("unit %s: released (%s); it runs again once that service answers", lost.unit_id, lost.cause)
    registry.forget_released(lost.unit_id)
