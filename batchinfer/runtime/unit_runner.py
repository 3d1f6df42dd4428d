"""Run one work unit: load its requests, generate, store the results, and commit behind a fence.

A unit can run twice (acks_late redelivers after a crash). Each run writes its own results file; the
conditional UPDATE on work_units lets exactly one run commit, so every request is counted once.
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Callable

from batchinfer.jobs.output import formats
from batchinfer.jobs import storage_keys
from batchinfer.context import AppContext
from batchinfer.engine.types import GenerationRequest, GenerationResult
from batchinfer.jobs.output.records import UnitRequest, UnitResult
from batchinfer.jobs.state import ending, units
from batchinfer.runtime import embedding_parts, outage
from batchinfer.runtime.generator import Generator
from batchinfer.runtime.progress import UnitWatch
from batchinfer.runtime.unit_inputs import unit_inputs

log = logging.getLogger(__name__)


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
    unfinished_jobs: frozenset[str] = frozenset()  # jobs its commit's counts show still open: no finalize try
    jobs: frozenset[str] = frozenset()  # every job with a request in the unit (read by its commit)


OnResult = Callable[[GenerationResult], None]
Aborts = Callable[[], Collection[str]]
Records = dict[tuple[str, int], UnitResult]


def run_unit(ctx: AppContext, unit_id: str, generator: Generator, worker: str,
             on_result: OnResult | None = None, incarnation: str | None = None,
             stopping: Callable[[], bool] = lambda: False) -> UnitOutcome:
    """stopping() says the worker is shutting down: a generation it interrupts raises UnitInterrupted."""
    started = outage.start_step(ctx, unit_id, lambda: units.start_unit(ctx, unit_id, worker, incarnation))
    if started is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, to_run, prefix_key = started.attempt, started.to_run, started.prefix_key
    steps = outage.UnitSteps(ctx, unit_id, attempt)  # storage or the database down: wait, then release (never fail)
    requests = steps.storage("load its requests", lambda: _load_requests(ctx, unit_id, to_run))
    watch = UnitWatch(ctx, unit_id, attempt, requests, ctx.settings.abort_poll_s, ctx.settings.progress_flush_s)
    with watch.watching(generator):  # live counts; stops a cancelled or expired job's requests
        records = _generate(requests, generator, worker, watch.listen(on_result), stopping, watch.aborts)
    work_tokens = sum(r.work_tokens for r in records.values())
    result_key = steps.storage("store its results", lambda: _write_results(ctx, unit_id, attempt, records))
    outcome = steps.database("commit", lambda: _commit(ctx, unit_id, result_key, records))
    outcome.prefix_key, outcome.work_tokens = prefix_key, work_tokens
    watch.finish(generator)
    if outcome.committed:
        jobs = sorted(({job_id for job_id, _ in to_run} | outcome.jobs) - outcome.unfinished_jobs)
        # the fast path to a finished job; the sweep finalizes whatever this misses (a crash, storage down)
        outcome.finalized_jobs = tuple(j for j in jobs if ending.try_finalize(ctx, j))
    return outcome


def _load_requests(ctx: AppContext, unit_id: str, to_run: AbstractSet[tuple[str, int]]) -> list[UnitRequest]:
    kept = unit_inputs(ctx.storage).take(unit_id)  # dispatched by this process: no GET, no parse
    if kept is not None:
        return [entry for entry in kept if entry.key in to_run]
    wanted = []
    with ctx.storage.open_read(storage_keys.unit_input(unit_id)) as stream:
        for raw in stream:
            entry = UnitRequest.from_json(raw)
            if entry.key in to_run:
                wanted.append(entry)
    return wanted


def _write_results(ctx: AppContext, unit_id: str, attempt: int, records: Records) -> str:
    result_key = storage_keys.unit_results(unit_id, attempt)
    with ctx.storage.open_write(result_key) as out:
        for key in sorted(records):
            out.write(records[key].to_line())
    return result_key


def _generate(requests: list[UnitRequest], generator: Generator, worker: str, on_result: OnResult | None,
              stopping: Callable[[], bool] = lambda: False, aborts: Aborts | None = None) -> Records:
    """One engine call for the unit. A request the engine refuses fails alone (its result carries the
    error), and a batch that fails anyway is run again one request at a time."""
    records: Records = {}
    try:
        records.update(_run_batch(requests, generator, worker, on_result, aborts))
    except Exception as exc:
        if stopping():
            raise UnitInterrupted(f"worker shutting down: {exc}") from exc
        if len(requests) == 1:
            r = requests[0]
            log.warning("request %s failed in the engine: %s", r.request_id, _cause(exc))
            records[r.key] = _error_record(r, "server_error", f"generation failed: {_cause(exc)}")
        else:
            log.warning("unit generation failed (%s); running its %d requests one at a time", _cause(exc), len(requests))
            for r in requests:
                records.update(_generate([r], generator, worker, on_result, stopping, aborts))
    return records


def _generation_request(r: UnitRequest) -> GenerationRequest:
    # a copy: the engine may set fields (arrival_time) on what it is given
    return GenerationRequest(r.request_id, list(r.request.prompt_token_ids), replace(r.request.sampling),
                             cache_salt=r.cache_salt)


def _run_batch(requests: list[UnitRequest], generator: Generator, worker: str, on_result: OnResult | None,
               aborts: Aborts | None = None) -> Records:
    """Aborted requests get no record: the watch closed them (cancelled, expired) when it stopped them."""
    if not requests:
        return {}
    by_id = {r.request_id: r for r in requests}
    expanded = {r.request_id: embedding_parts.expand(_generation_request(r), (r.request.echo or {}).get("inputs"))
                for r in requests}
    parts = {rid: len(e) for rid, e in expanded.items() if len(e) > 1}
    records: Records = {}
    dtype = getattr(generator, "dtype_note", "float32 (asked)").split(" ")[0]
    weights = getattr(generator, "weights_note", None)  # LLMEngine's; the hf and null engines have no formats
    results = generator.generate([g for e in expanded.values() for g in e], on_result=on_result, aborts=aborts)
    for request_id, found in embedding_parts.grouped(results, parts):
        r = by_id[request_id]
        if any(x.aborted for x in found):
            continue
        error = next((x.error for x in found if x.error), None)  # refused by the generator (engine.types.refusal): this request alone fails
        if error:
            records[r.key] = _error_record(r, "invalid_request", error[:500])
            continue
        p = r.request
        line = (formats.embeddings_output_line(r.job_id, p.index, p.custom_id, p.model, found, worker, p.echo)
                if p.sampling.embed else
                formats.output_line(r.job_id, p.index, p.custom_id, p.url, p.model, found[0], worker, p.echo))
        line["metrics"]["dtype"] = dtype  # which dtype and weights answered: outputs compare only within one
        if weights:
            line["metrics"]["weight_format"] = weights.split(" ")[0]
        records[r.key] = UnitResult(r.job_id, p.index, p.line, True, line, sum(x.prompt_tokens for x in found),
                                    sum(x.completion_tokens for x in found), sum(x.cached_tokens for x in found))
    return records


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _error_record(r: UnitRequest, code: str, message: str) -> UnitResult:
    p = r.request
    return UnitResult(r.job_id, p.index, p.line, False, formats.error_line(r.job_id, p.index, p.custom_id, code,
                                                                           message, p.line))


def _commit(ctx: AppContext, unit_id: str, result_key: str, records: Records) -> UnitOutcome:
    committed = units.commit_unit(ctx, unit_id, result_key, records)
    if committed is None:
        return UnitOutcome(unit_id, committed=False)
    return UnitOutcome(unit_id, committed=True, completed=committed.completed, failed=committed.failed,
                       unfinished_jobs=committed.unfinished_jobs, jobs=committed.jobs)


def fail_unit(ctx: AppContext, unit_id: str, cause: str) -> UnitOutcome:
    """A unit that kept failing (its retries are spent): its open requests fail with server_error and the
    cause, into a results file like any run's, so the job can finish."""
    found = units.open_requests(ctx, unit_id)
    if found is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, open_ = found[0] + 1, found[1]
    requests = _load_requests(ctx, unit_id, open_)
    message = f"the unit failed {attempt - 1} times: {cause}"[:500]
    records = {r.key: _error_record(r, "server_error", message) for r in requests}
    result_key = _write_results(ctx, unit_id, attempt, records)
    outcome = _commit(ctx, unit_id, result_key, records)
    if outcome.committed:
        log.error("unit %s failed for good: %d requests fail with server_error (%s)", unit_id, len(records), cause)
        for job_id in sorted({j for j, _ in records}):
            ending.try_finalize(ctx, job_id)
    return outcome

