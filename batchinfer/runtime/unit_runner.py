"""Run one work unit: load its requests, generate, store the results, and commit behind a fence.

A unit can run twice (acks_late redelivers after a crash). Each run writes its own results file; the
conditional UPDATE on work_units lets exactly one run commit, so every request is counted once.
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import bindparam, select, update

from batchinfer.jobs import formats, keys, service
from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import transaction
from batchinfer.engine.types import GenerationRequest, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class UnitOutcome:
    unit_id: str
    committed: bool  # False: another run had already committed this unit
    completed: int = 0
    failed: int = 0
    finalized_jobs: tuple[str, ...] = ()
    prefix_key: str = ""
    work_tokens: int = 0  # uncached prompt + completion tokens this run computed


def run_unit(ctx: AppContext, unit_id: str, generator, worker: str,
             on_result: Callable[[object], None] | None = None) -> UnitOutcome:
    service.expire_overdue(ctx)
    started = _start(ctx, unit_id, worker)
    if started is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, to_run, prefix_key = started
    requests = _load_requests(ctx, unit_id, to_run)
    records = _generate(requests, generator, worker, on_result)
    work_tokens = sum(r["tokens"][0] - r["tokens"][2] + r["tokens"][1] for r in records.values())
    result_key = keys.unit_results(unit_id, attempt)
    with ctx.storage.open_write(result_key) as out:
        for key in sorted(records):
            out.write(json.dumps(records[key], separators=(",", ":")).encode() + b"\n")
    outcome = _commit(ctx, unit_id, result_key, records)
    outcome.prefix_key, outcome.work_tokens = prefix_key, work_tokens
    if outcome.committed:
        jobs = sorted({job_id for job_id, _ in to_run} | _jobs_of_unit(ctx, unit_id))
        outcome.finalized_jobs = tuple(j for j in jobs if service.try_finalize(ctx, j))
    return outcome


def _start(ctx: AppContext, unit_id: str, worker: str) -> tuple[int, set[tuple[str, int]], str] | None:
    """Mark the unit and its still-wanted requests running; None when the unit is already done."""
    now = time.time()
    with transaction(ctx.sessions) as session:
        unit = session.get(WorkUnit, unit_id, with_for_update=True)
        if unit is None or unit.status == UnitStatus.DONE:
            return None
        unit.status, unit.started_at, unit.worker = UnitStatus.RUNNING, now, worker
        unit.attempts += 1
        runnable = (select(Request.job_id, Request.index).join(Job, Job.id == Request.job_id)
                    .where(Request.unit_id == unit_id, Job.status.in_(JobStatus.RUNNABLE),
                           Request.status.in_((RequestStatus.PLANNED, RequestStatus.RUNNING))))
        to_run = {(j, i) for j, i in session.execute(runnable)}
        stmt = (update(Request).where(Request.job_id == bindparam("j"), Request.index == bindparam("i"))
                .values(status=RequestStatus.RUNNING))
        if to_run:
            session.connection().execute(stmt, [{"j": j, "i": i} for j, i in to_run])
        job_ids = {j for j, _ in to_run}
        session.execute(update(Job).where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED)
                        .values(status=JobStatus.IN_PROGRESS, in_progress_at=now))
        return unit.attempts, to_run, unit.prefix_key


def _load_requests(ctx: AppContext, unit_id: str, to_run: set[tuple[str, int]]) -> list[dict]:
    wanted = []
    with ctx.storage.open_read(keys.unit_input(unit_id)) as stream:
        for raw in stream:
            entry = json.loads(raw)
            if (entry["job_id"], entry["index"]) in to_run:
                wanted.append(entry)
    return wanted


def _generate(requests: list[dict], generator, worker: str, on_result) -> dict[tuple[str, int], dict]:
    by_id = {f"{r['job_id']}:{r['index']}": r for r in requests}
    gen_requests = [GenerationRequest(rid, r["prompt_token_ids"], _sampling(r["sampling"])) for rid, r in by_id.items()]
    records: dict[tuple[str, int], dict] = {}
    try:
        results = generator.generate(gen_requests, on_result=on_result)
    except Exception as exc:  # the engine failed the whole unit: its requests fail, nothing is lost silently
        log.exception("unit generation failed")
        for r in requests:
            records[r["job_id"], r["index"]] = _error_record(r, "server_error", f"generation failed: {exc}")
        return records
    for result in results:
        r = by_id[result.request_id]
        line = formats.output_line(r["job_id"], r["index"], r["custom_id"], r["url"], r["model"], result, worker)
        records[r["job_id"], r["index"]] = {"job_id": r["job_id"], "index": r["index"], "line": r["line"], "ok": True,
                                           "record": line, "tokens": [result.prompt_tokens, result.completion_tokens,
                                                                      result.cached_tokens]}
    return records


def _sampling(params: dict) -> SamplingParams:
    return SamplingParams(max_tokens=params["max_tokens"], temperature=params["temperature"], top_p=params["top_p"],
                          top_k=params["top_k"], seed=params["seed"], stop=tuple(params["stop"]))


def _error_record(r: dict, code: str, message: str) -> dict:
    line = formats.error_line(r["job_id"], r["index"], r["custom_id"], code, message, r["line"])
    return {"job_id": r["job_id"], "index": r["index"], "line": r["line"], "ok": False, "record": line,
            "tokens": [0, 0, 0]}


def _commit(ctx: AppContext, unit_id: str, result_key: str, records: dict) -> UnitOutcome:
    with transaction(ctx.sessions) as session:
        fence = session.execute(update(WorkUnit).where(WorkUnit.id == unit_id, WorkUnit.status != UnitStatus.DONE)
                                .values(status=UnitStatus.DONE, result_key=result_key, finished_at=time.time()))
        if fence.rowcount != 1:
            log.info("unit %s was already committed by another run; dropping this run's results", unit_id)
            return UnitOutcome(unit_id, committed=False)
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
        for status in (RequestStatus.COMPLETED, RequestStatus.FAILED):
            ok = status == RequestStatus.COMPLETED
            batch = [{"j": j, "i": i} for (j, i), rec in records.items() if rec["ok"] == ok]
            if batch:
                stmt = (update(Request).where(Request.job_id == bindparam("j"), Request.index == bindparam("i"),
                                              Request.status == RequestStatus.RUNNING).values(status=status))
                session.connection().execute(stmt, batch)
        for (job_id, _), rec in records.items():
            t = totals[job_id]
            t[0 if rec["ok"] else 1] += 1
            for k in range(3):
                t[2 + k] += rec["tokens"][k]
        for job_id, (done, failed, prompt, completion, cached) in totals.items():
            session.execute(update(Job).where(Job.id == job_id).values(
                completed=Job.completed + done, failed=Job.failed + failed, prompt_tokens=Job.prompt_tokens + prompt,
                completion_tokens=Job.completion_tokens + completion, cached_tokens=Job.cached_tokens + cached))
    n_ok = sum(1 for r in records.values() if r["ok"])
    return UnitOutcome(unit_id, committed=True, completed=n_ok, failed=len(records) - n_ok)


def _jobs_of_unit(ctx: AppContext, unit_id: str) -> set[str]:
    with ctx.sessions() as session:
        return set(session.scalars(select(Request.job_id).where(Request.unit_id == unit_id).distinct()))
