"""Task entry points. Tasks take ids only; everything else comes from the database and storage."""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, NoReturn

from redis.exceptions import LockError, LockNotOwnedError, RedisError
from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.errors import one_line
from batchinfer.db.models import JobStatus, WorkUnit
from batchinfer.jobs.intake.validate_job import ValidationDeferred, deferred_cause, validate_job
from batchinfer.jobs.state import units
from batchinfer.jobs.dispatch.planning import DispatchedUnit, dispatch, more_pending, still_validating
from batchinfer.runtime.engine_process import EngineProcessLost, generator_for
from batchinfer.cluster.broker import broker_priority
from batchinfer.cluster.fair_queue import open_fair_queue
from batchinfer.cluster.registry import open_registry
from batchinfer.jobs.dispatch.routing import SHARED_QUEUE, model_queue
from batchinfer.cluster.sweep import SweepHooks
from batchinfer.settings import get_settings
from batchinfer.jobs.outage import ServiceOutage
from batchinfer.jobs.units.waits import UnitReleased, start_step
from batchinfer.jobs.units.runner import UnitInterrupted, fail_unit, run_unit
from workers.celery_app import app
from workers.process import WorkerProcess, this_process

log = logging.getLogger(__name__)
DISPATCH_TASK = "batchinfer.dispatch"  # task names stay as they were: messages already queued still run
RUN_UNIT_TASK = "batchinfer.run_unit"


FIRST_ROUND_UNITS = 16  # units the first dispatch round persists: a unit runs while the rest is planned
ROUND_GROWTH = 4  # each later round persists this many times more (50,000 requests in 64: 4 rounds)


def round_units(round_no: int | None) -> int | None:
    """Units round `round_no` persists; None (the sweep's dispatch, `batchinfer run`'s): all of the plan."""
    return None if round_no is None else FIRST_ROUND_UNITS * ROUND_GROWTH ** min(round_no, 8)


def dispatch_units(ctx: AppContext, on_units: Callable[[list[DispatchedUnit]], None] | None = None,
                   max_units: int | None = None) -> list[DispatchedUnit]:
    """Plan what is pending and route it on the registry's view of the live workers; on_units sees each batch
    as it is committed (dispatch_and_send sends them then)."""
    loads = open_registry(ctx.settings).loads()
    return dispatch(ctx, [w.name for w in loads], worker_loads=loads, on_units=on_units, max_units=max_units)


def send_units(units: list[DispatchedUnit]) -> None:
    for unit in units:
        run_unit_task.apply_async(args=[unit.unit_id], queue=unit.queue, priority=broker_priority(unit.level))


def dispatch_and_send(ctx: AppContext, incarnation: str | None = None, round_no: int | None = None) -> int:
    """Dispatch under the dispatch lock and send each unit (the sweep calls this for lost dispatches too, with
    no round: the whole plan). A dispatch task runs in rounds: when a round left pending work, the next round
    goes to the task queue behind the units just sent, so a worker with one slot (the solo pool) runs units
    between rounds instead of after the whole plan, and no round outlives the lock.
    A lock that stays held past its wait is not an error: its holder is planning what is pending, and the
    sweep dispatches whatever arrived after (50 submits at once on 2 cores kept one dispatcher busy > 120 s)."""
    lock = open_registry(ctx.settings).dispatch_lock()
    # the holder's incarnation as the token: the sweep leaves a live dispatcher's unsent units alone
    if not lock.acquire(token=incarnation):
        log.info("dispatch skipped: another dispatcher still holds the lock; the sweep dispatches what it leaves")
        return 0
    began = time.monotonic()  # the round's own length, not its wait for the lock
    sent: list[DispatchedUnit] = []

    def send_and_renew(batch: list[DispatchedUnit]) -> None:
        send_units(batch)  # each batch sent once committed: the first run early
        sent.extend(batch)
        # renewed at each committed batch, so a long dispatch keeps it (a 705 s one outlived its 600 s and the
        # sweep dispatched beside it); a wedged one stops renewing and loses it
        try:
            lock.reacquire()
        except LockNotOwnedError as exc:
            raise DispatchLockLost() from exc

    try:
        dispatch_units(ctx, on_units=send_and_renew, max_units=round_units(round_no))
    except DispatchLockLost:  # claims stay safe without it (one transaction each); the holder plans the rest
        log.warning("dispatch stopped after %d units: its lock expired and another dispatcher may hold it", len(sent))
        return len(sent)
    finally:
        try:
            lock.release()
        except LockError:  # held past its timeout: it has expired by itself
            pass
    log.info("dispatched %d units (round %s)", len(sent), round_no)
    if round_no is not None:
        _chain(ctx, round_no, bool(sent), time.monotonic() - began)
    return len(sent)


def _chain(ctx: AppContext, round_no: int, sent: bool, round_s: float) -> None:
    """Queue the next round, if any. A round that planned nothing ends the chain (what it could not plan is left
    to the sweep: rounds always progress), except while a file is still validated: then the units kept up with
    its validation, and the chain waits for its next rows (without this, a file whose units kept up got no
    dispatch until its queue move). Only one chain waits at a time, however many files are validated (each
    file's first rows start one)."""
    validating = still_validating(ctx)
    if sent and more_pending(ctx):
        if validating:
            next_round(round_no + 1, stream_round_gap(round_s))
        else:
            next_round(round_no + 1)
    elif validating and open_registry(ctx.settings).due("stream-round-wait", STREAM_WAIT_S * 0.9):
        next_round(round_no + 1, STREAM_WAIT_S)


# a file still validated keeps a round chain going, each round this long after the last (rounds back to back, with
# no gap, left a solo worker one unit between them) or STREAM_ROUND_SHARE times the round's own length if longer.
# Short since rounds cut units by the rows their file has so far (dispatch._backlog): 2 s / 3x (when they cut them by
# what was pending) left a worker 4 s without units at 50,000 requests; 0.5 s / 0.5x: 28-32 -> 22 s end to end,
# and the 200 MB file no slower (docs/benchmarks.md, "An AVX-512 EPYC (Zen 4): the job system").
STREAM_ROUND_GAP_S = 0.5
STREAM_ROUND_SHARE = 0.5
STREAM_ROUND_GAP_MAX_S = 30.0  # a long file still streams: its rounds keep coming while it validates
STREAM_WAIT_S = 2.0  # a chain that found nothing to send looks again this much later while a file is validated


def stream_round_gap(round_s: float) -> float:
    """The countdown of the next round while a file is still validated: the worker runs units in between."""
    return min(STREAM_ROUND_GAP_MAX_S, max(STREAM_ROUND_GAP_S, STREAM_ROUND_SHARE * round_s))


def next_round(round_no: int, countdown: float | None = None) -> None:
    dispatch_task.apply_async(args=[round_no], queue=SHARED_QUEUE, countdown=countdown)


class DispatchLockLost(Exception):
    """The dispatch lock expired under a running dispatch: it stops at the batch it just sent."""


@app.task(name=DISPATCH_TASK)
def dispatch_task(round_no: int = 0) -> int:
    process = this_process()
    return dispatch_and_send(process.ctx, process.incarnation, round_no)


@app.task(name=RUN_UNIT_TASK, bind=True)
def run_unit_task(self, unit_id: str) -> dict:
    process = this_process()
    ctx, agent = process.ctx, process.agent
    worker = (self.request.hostname or "worker").split("@")[0]
    try:  # the database down: waited out as the unit's start would be, then left to the sweep
        elsewhere = start_step(ctx, unit_id, lambda: _other_model(ctx, unit_id))
    except ServiceOutage as exc:
        log.warning("%s; it runs again once that service answers", exc)
        return {"unit_id": unit_id, "committed": False, "completed": 0}
    if elsewhere is not None:  # sent here by a path that knows no models (an old message): to its model's workers
        priority = (self.request.delivery_info or {}).get("priority")
        run_unit_task.apply_async(args=[unit_id], queue=model_queue(elsewhere), priority=priority)
        log.info("unit %s is for model %s, not this worker's: sent to its queue", unit_id, elsewhere)
        return {"unit_id": unit_id, "committed": False, "completed": 0}
    started = time.time()
    if agent is not None:
        agent.unit_started(unit_id)
    outcome = None
    try:
        outcome = run_unit(ctx, unit_id, engine_or_exit(ctx.settings), worker, incarnation=process.incarnation,
                           stopping=process.stopping)
    except EngineProcessLost as exc:
        _engine_lost(exc)
    except UnitInterrupted as exc:  # the unit stays running on this incarnation; the sweep reruns it
        log.warning("unit %s interrupted by shutdown (%s); it will be rerun", unit_id, exc)
        return {"unit_id": unit_id, "committed": False, "completed": 0}
    except (UnitReleased, ServiceOutage) as exc:  # a service stayed down: the sweep sends it again once it answers
        log.warning("%s; it runs again once that service answers", exc)
        if isinstance(exc, UnitReleased) and not exc.recorded:
            _note_for_the_sweep(ctx, exc)
        return {"unit_id": unit_id, "committed": False, "completed": 0}
    except Exception as exc:  # storage or database still down after retries: the sweep reruns it, then fails it
        log.warning("unit %s did not commit: %s: %s; it will be rerun", unit_id, type(exc).__name__, str(exc)[:300])
        _note_error(ctx, unit_id, f"{type(exc).__name__}: {str(exc)[:300]}")
        return {"unit_id": unit_id, "committed": False, "completed": 0}
    finally:
        if agent is not None:
            agent.unit_finished(outcome.prefix_key if outcome else "", outcome.work_tokens if outcome else 0,
                                time.time() - started)
    return {"unit_id": unit_id, "committed": outcome.committed, "completed": outcome.completed}


def _note_for_the_sweep(ctx: AppContext, released: UnitReleased) -> None:
    """The database could not take the release: the broker keeps it until the sweep can write it."""
    try:
        open_registry(ctx.settings).note_released(released.unit_id, released.attempt, released.service)
    except Exception as exc:  # the broker down too: the sweep reruns the unit as lost (one attempt counted)
        log.warning("unit %s: could not leave its release for the sweep: %s", released.unit_id, one_line(exc))


def engine_or_exit(settings):
    """The worker's generator (through its engine process, when it forked one)."""
    try:
        return generator_for(settings)
    except EngineProcessLost as exc:
        _engine_lost(exc)


def _engine_lost(exc: EngineProcessLost) -> NoReturn:
    """The engine process killed (out of memory, a signal) is this worker's death too: it exits as a crash would,
    and the sweep reruns the unit it held (no request of it is failed)."""
    log.critical("%s: this worker stops; its unit runs again", exc)
    logging.shutdown()
    os._exit(70)


def _unit_model(ctx: AppContext, unit_id: str) -> str | None:
    with ctx.sessions() as session:
        return session.scalar(select(WorkUnit.model).where(WorkUnit.id == unit_id))


def _other_model(ctx: AppContext, unit_id: str) -> str | None:
    """The unit's model when it is not this worker's (None: this worker's, or a unit from before models)."""
    model = _unit_model(ctx, unit_id)
    return model if model and model != ctx.settings.model_id else None


def _note_error(ctx: AppContext, unit_id: str, cause: str) -> None:
    """Best effort: the cause shows in the error lines if the unit fails for good."""
    try:
        units.note_unit_error(ctx, unit_id, cause)
    except Exception:
        log.warning("could not record the error of unit %s", unit_id)


def sweep_hooks(process: WorkerProcess) -> SweepHooks:
    ctx = process.ctx

    def fail(unit_id: str, cause: str):
        with ctx.sessions() as session:
            unit = session.get(WorkUnit, unit_id)
            last = unit.last_error if unit is not None else None
        return fail_unit(ctx, unit_id, f"{cause}; last error: {last}" if last else cause).committed

    return SweepHooks(requeue=requeue_unit, fail=fail, dispatch=lambda: dispatch_and_send(ctx, process.incarnation),
                      revalidate=lambda job_id: validate_job_task.apply_async(args=[job_id], queue=SHARED_QUEUE))


def requeue_unit(unit_id: str) -> None:
    """Run a unit again (the sweep found it lost) on a worker of its model; the unit runner's fence keeps it
    from counting twice."""
    model = _unit_model(this_process().ctx, unit_id)
    run_unit_task.apply_async(args=[unit_id], queue=model_queue(model) if model else SHARED_QUEUE)


def trigger_dispatch(countdown: float | None = None) -> None:
    """Called after a submit: the short countdown lets concurrent submissions be planned together."""
    delay = get_settings().dispatch_countdown_s if countdown is None else countdown
    dispatch_task.apply_async(countdown=delay, queue=SHARED_QUEUE)


def stream_dispatch() -> None:
    """Asked by a validation (settings.stream_dispatch) once its first rows are committed: a dispatch in rounds
    that plans the full units of the file so far; each round that sent some queues the next, and the queue
    move asks for the dispatch that plans the rest."""
    dispatch_task.apply_async(args=[0], queue=SHARED_QUEUE)


VALIDATE_TASK = "batchinfer.validate_job"
ESTIMATE_TASK = "batchinfer.estimate"
FAIR_TASK = "batchinfer.fair_work"


@app.task(name=VALIDATE_TASK)
def validate_job_task(job_id: str) -> str:
    """Validation off the API's request path (tokenizing needs the model's tokenizer, which workers hold),
    and of jobs the sweep found stuck in `validating` (a submit that crashed)."""
    try:
        status = validate_job(this_process().ctx, job_id, on_rows=stream_dispatch).status
    except ValidationDeferred as exc:  # kept `validating`: the sweep hands it on again once storage is back
        log.warning("%s (%s)", exc, deferred_cause(exc))
        return JobStatus.VALIDATING
    if status == JobStatus.QUEUED:
        trigger_dispatch()
    return status


@app.task(name=ESTIMATE_TASK)
def estimate_task(estimate_id: str, input_key: str) -> None:
    """The dry-run estimate of a stored file, written to storage for the API to read back."""
    from batchinfer.runtime.preview import store_estimate

    ctx = this_process().ctx
    store_estimate(ctx, estimate_id, input_key, open_registry(ctx.settings).live())


@app.task(name=FAIR_TASK)
def fair_work_task() -> str | None:
    """One validation or estimate from the API, of the key served longest ago (cluster.fair_queue): the message
    names no item, so the order is decided now, when this worker is free."""
    ctx = this_process().ctx
    try:
        taken = open_fair_queue(ctx.settings).pop()
    except RedisError as exc:  # a validation left `validating` is redone by the sweep; an estimate's waiter times out
        log.warning("could not take work from the fair queue (%s)", type(exc).__name__)
        return None
    if taken is None:
        return None
    owner, item = taken
    if item["kind"] == "validate":
        return validate_job_task(item["job_id"])
    if time.time() - item["posted_at"] > ctx.settings.api_estimate_wait_s:
        log.info("estimate %s of key %s dropped: its waiter has stopped waiting", item["estimate_id"], owner)
        return None
    estimate_task(item["estimate_id"], item["input_key"])
    return "estimated"
