"""Run one work unit: load its requests, generate, store the results, and commit behind a fence.

A unit can run twice (acks_late redelivers after a crash). Each run writes its own results file; the
conditional UPDATE on work_units lets exactly one run commit, so every request is counted once.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Collection, Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Callable

from sqlalchemy import bindparam, or_, select, update

from batchinfer.jobs import formats, keys, lifecycle
from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import retrying
from batchinfer.engine.types import GenerationRequest, GenerationResult
from batchinfer.jobs.records import UnitRequest, UnitResult
from batchinfer.runtime.generator import CheckingGenerator, Generator
from batchinfer.runtime.progress import UnitWatch

log = logging.getLogger(__name__)
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed accepts


class UnitInterrupted(Exception):
    """The worker is shutting down mid-unit: nothing is committed, and the sweep reruns the unit."""


@dataclass
class UnitOutcome:
    unit_id: str
    committed: bool  # False: another run had already committed this unit
    completed: int = 0
    failed: int = 0
    finalized_jobs: tuple[str, ...] = ()
    prefix_key: str = ""
    work_tokens: int = 0  # uncached prompt + completion tokens this run computed


OnResult = Callable[[GenerationResult], None]
Aborts = Callable[[], Collection[str]]
Records = dict[tuple[str, int], UnitResult]


def run_unit(ctx: AppContext, unit_id: str, generator: Generator, worker: str,
             on_result: OnResult | None = None, incarnation: str | None = None,
             stopping: Callable[[], bool] = lambda: False) -> UnitOutcome:
    """stopping() says the worker is shutting down: a generation it interrupts raises UnitInterrupted."""
    started = _start(ctx, unit_id, worker, incarnation)
    if started is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, to_run, prefix_key = started
    requests = _load_requests(ctx, unit_id, to_run)
    watch = UnitWatch(ctx, unit_id, attempt, requests, ctx.settings.abort_poll_s, ctx.settings.progress_flush_s)
    with watch.watching(generator):  # live counts; stops a cancelled or expired job's requests
        records = _generate(requests, generator, worker, watch.listen(on_result), stopping, watch.aborts)
    work_tokens = sum(r.work_tokens for r in records.values())
    result_key = _write_results(ctx, unit_id, attempt, records)
    outcome = _commit(ctx, unit_id, result_key, records)
    outcome.prefix_key, outcome.work_tokens = prefix_key, work_tokens
    watch.finish(generator)
    if outcome.committed:
        jobs = sorted({job_id for job_id, _ in to_run} | _jobs_of_unit(ctx, unit_id))
        # the fast path to a finished job; the sweep finalizes whatever this misses (a crash, storage down)
        outcome.finalized_jobs = tuple(j for j in jobs if lifecycle.try_finalize(ctx, j))
    return outcome


def _start(ctx: AppContext, unit_id: str, worker: str,
           incarnation: str | None = None) -> tuple[int, set[tuple[str, int]], str] | None:
    """Mark the unit and its still-wanted requests running; None when the unit is already done."""
    now = time.time()

    def work(session):
        unit = session.get(WorkUnit, unit_id, with_for_update=True)
        if unit is None or unit.status == UnitStatus.DONE:
            return None
        unit.status, unit.started_at, unit.worker, unit.incarnation = UnitStatus.RUNNING, now, worker, incarnation
        unit.attempts += 1
        runnable = (select(Request.job_id, Request.index).join(Job, Job.id == Request.job_id)
                    .where(Request.unit_id == unit_id, Job.status.in_(JobStatus.RUNNABLE),
                           Request.status.in_((RequestStatus.PLANNED, RequestStatus.RUNNING))))
        to_run = {(j, i) for j, i in session.execute(runnable)}
        for job_id in sorted({j for j, _ in to_run}):  # job rows before request rows, in id order
            session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED)
                            .values(status=JobStatus.IN_PROGRESS, in_progress_at=now))
        # The status condition matters: a cancel that committed while this waited for the row keeps its
        # `cancelled` (already counted as failed); without it the request ran and was counted twice.
        stmt = (update(Request).where(Request.job_id == bindparam("j"), Request.index == bindparam("i"),
                                      or_(Request.status == RequestStatus.PLANNED, Request.status == RequestStatus.RUNNING))
                .values(status=RequestStatus.RUNNING))  # (no IN: executemany cannot expand it)
        if to_run:
            session.connection().execute(stmt, [{"j": j, "i": i} for j, i in sorted(to_run)])
        return unit.attempts, to_run, unit.prefix_key

    return retrying(ctx.sessions, work)


def _load_requests(ctx: AppContext, unit_id: str, to_run: AbstractSet[tuple[str, int]]) -> list[UnitRequest]:
    wanted = []
    with ctx.storage.open_read(keys.unit_input(unit_id)) as stream:
        for raw in stream:
            entry = UnitRequest.from_json(raw)
            if entry.key in to_run:
                wanted.append(entry)
    return wanted


def _write_results(ctx: AppContext, unit_id: str, attempt: int, records: Records) -> str:
    result_key = keys.unit_results(unit_id, attempt)
    with ctx.storage.open_write(result_key) as out:
        for key in sorted(records):
            out.write(records[key].to_json() + b"\n")
    return result_key


def _generate(requests: list[UnitRequest], generator: Generator, worker: str, on_result: OnResult | None,
              stopping: Callable[[], bool] = lambda: False, aborts: Aborts | None = None) -> Records:
    """One engine call for the unit. A request the engine refuses fails alone: it is checked before the
    batch runs, and a batch that fails anyway is run again one request at a time."""
    records: Records = {}
    runnable = []
    for r in requests:
        refused = _refusal(generator, r)
        if refused:
            records[r.key] = _error_record(r, "invalid_request", refused)
        else:
            runnable.append(r)
    try:
        records.update(_run_batch(runnable, generator, worker, on_result, aborts))
    except Exception as exc:
        if stopping():
            raise UnitInterrupted(f"worker shutting down: {exc}") from exc
        if len(runnable) == 1:
            r = runnable[0]
            log.warning("request %s failed in the engine: %s", r.request_id, _cause(exc))
            records[r.key] = _error_record(r, "server_error", f"generation failed: {_cause(exc)}")
        else:
            log.warning("unit generation failed (%s); running its %d requests one at a time", _cause(exc), len(runnable))
            for r in runnable:
                records.update(_generate([r], generator, worker, on_result, stopping, aborts))
    return records


def _generation_request(r: UnitRequest) -> GenerationRequest:
    # a copy: the engine may set fields (arrival_time) on what it is given
    return GenerationRequest(r.request_id, list(r.request.prompt_token_ids), replace(r.request.sampling))


def _run_batch(requests: list[UnitRequest], generator: Generator, worker: str, on_result: OnResult | None,
               aborts: Aborts | None = None) -> Records:
    """Aborted requests get no record: the watch closed them (cancelled, expired) when it stopped them."""
    if not requests:
        return {}
    by_id = {r.request_id: r for r in requests}
    records: Records = {}
    for result in generator.generate([_generation_request(r) for r in requests], on_result=on_result, aborts=aborts):
        r = by_id[result.request_id]
        if result.aborted:
            continue
        error = getattr(result, "error", None)  # an engine that reports per-request errors
        if error:
            records[r.key] = _error_record(r, "invalid_request", str(error)[:500])
            continue
        p = r.request
        line = formats.output_line(r.job_id, p.index, p.custom_id, p.url, p.model, result, worker)
        records[r.key] = UnitResult(r.job_id, p.index, p.line, True, line, result.prompt_tokens,
                                    result.completion_tokens, result.cached_tokens)
    return records


def _refusal(generator: Generator, r: UnitRequest) -> str | None:
    """Why the engine can never run this request, or None (checked before the batch, so it fails alone)."""
    seed = r.request.sampling.seed
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        return f"seed {str(seed)[:40]} is outside the range the sampler accepts"
    if not isinstance(generator, CheckingGenerator):
        return None
    try:
        generator.check_request(_generation_request(r))
    except ValueError as exc:
        return str(exc)[:500]
    return None


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _error_record(r: UnitRequest, code: str, message: str) -> UnitResult:
    p = r.request
    return UnitResult(r.job_id, p.index, p.line, False, formats.error_line(r.job_id, p.index, p.custom_id, code,
                                                                           message, p.line))


def _commit(ctx: AppContext, unit_id: str, result_key: str, records: Records) -> UnitOutcome:
    return retrying(ctx.sessions, lambda session: _commit_in(session, unit_id, result_key, records))


def _commit_in(session, unit_id: str, result_key: str, records: Records) -> UnitOutcome:
    fence = session.execute(update(WorkUnit).where(WorkUnit.id == unit_id, WorkUnit.status != UnitStatus.DONE)
                            .values(status=UnitStatus.DONE, result_key=result_key, finished_at=time.time(),
                                    last_error=None))
    if fence.rowcount != 1:
        log.info("unit %s was already committed by another run; dropping this run's results", unit_id)
        return UnitOutcome(unit_id, committed=False)
    job_ids = sorted({j for j, _ in records})
    if job_ids:  # job rows before request rows, in id order (the lock order of the whole job system)
        session.execute(select(Job.id).where(Job.id.in_(job_ids)).order_by(Job.id).with_for_update())
    still_open = set(session.execute(select(Request.job_id, Request.index).where(
        Request.unit_id == unit_id, Request.status.in_((RequestStatus.PLANNED, RequestStatus.RUNNING)))))
    records = {k: rec for k, rec in records.items() if k in still_open}  # a request cancelled meanwhile stays so
    for status in (RequestStatus.COMPLETED, RequestStatus.FAILED):
        ok = status == RequestStatus.COMPLETED
        batch = [{"j": j, "i": i, "p": rec.prompt_tokens, "c": rec.completion_tokens, "k": rec.cached_tokens}
                 for (j, i), rec in sorted(records.items()) if rec.ok == ok]
        if batch:
            stmt = (update(Request).where(Request.job_id == bindparam("j"), Request.index == bindparam("i"))
                    .values(status=status, prompt_tokens=bindparam("p"), completion_tokens=bindparam("c"),
                            cached_tokens=bindparam("k")))
            session.connection().execute(stmt, batch)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for (job_id, _), rec in records.items():
        t = totals[job_id]
        t[0 if rec.ok else 1] += 1
        t[2] += rec.prompt_tokens
        t[3] += rec.completion_tokens
        t[4] += rec.cached_tokens
    for job_id, (done, failed, prompt, completion, cached) in sorted(totals.items()):
        session.execute(update(Job).where(Job.id == job_id).values(
            completed=Job.completed + done, failed=Job.failed + failed, prompt_tokens=Job.prompt_tokens + prompt,
            completion_tokens=Job.completion_tokens + completion, cached_tokens=Job.cached_tokens + cached))
    n_ok = sum(1 for r in records.values() if r.ok)
    return UnitOutcome(unit_id, committed=True, completed=n_ok, failed=len(records) - n_ok)


def fail_unit(ctx: AppContext, unit_id: str, cause: str) -> UnitOutcome:
    """A unit that kept failing (its retries are spent): its open requests fail with server_error and the
    cause, into a results file like any run's, so the job can finish."""
    with ctx.sessions() as session:
        unit = session.get(WorkUnit, unit_id)
        if unit is None or unit.status == UnitStatus.DONE:
            return UnitOutcome(unit_id, committed=False)
        attempt = unit.attempts + 1
        open_ = set(session.execute(select(Request.job_id, Request.index).where(
            Request.unit_id == unit_id, Request.status.in_((RequestStatus.PLANNED, RequestStatus.RUNNING)))))
    requests = _load_requests(ctx, unit_id, open_)
    message = f"the unit failed {attempt - 1} times: {cause}"[:500]
    records = {r.key: _error_record(r, "server_error", message) for r in requests}
    result_key = _write_results(ctx, unit_id, attempt, records)
    outcome = _commit(ctx, unit_id, result_key, records)
    if outcome.committed:
        log.error("unit %s failed for good: %d requests fail with server_error (%s)", unit_id, len(records), cause)
        for job_id in sorted({j for j, _ in records}):
            lifecycle.try_finalize(ctx, job_id)
    return outcome


def _jobs_of_unit(ctx: AppContext, unit_id: str) -> set[str]:
    with ctx.sessions() as session:
        return set(session.scalars(select(Request.job_id).where(Request.unit_id == unit_id).distinct()))
