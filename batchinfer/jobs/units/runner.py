"""Run one work unit: load its requests, generate, store the results, and commit behind a fence.

A unit can run twice (acks_late redelivers after a crash). Each run writes its own results file; the
conditional UPDATE on work_units lets exactly one run commit, so every request is counted once.
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Callable

from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs.endpoints import kinds
from batchinfer.jobs import record_store
from batchinfer.context import AppContext
from batchinfer.engine.lora.request import LoRARequest
from batchinfer.engine.types import GenerationResult
from batchinfer.jobs.records import Origin, RequestKey, UnitRequest, UnitResult
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import units
from batchinfer.jobs.units import waits as outage
from batchinfer.jobs.units.chunks import UnitChunks
from batchinfer.jobs.units.adapter_files import local_adapters
from batchinfer.jobs.units.engine_requests import EngineRequests
from batchinfer.jobs.units.generator import Generator
from batchinfer.jobs.units.progress import OnResult, UnitWatch

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
    given_back: int = 0  # requests the worker's drain stopped, back to pending for another worker
    adapters: tuple[str, ...] = ()  # the LoRA adapters its lines named, in order (its engine loaded them)


Aborts = Callable[[], Collection[str]]
EngineResult = Callable[[GenerationResult], None]
Records = dict[RequestKey, UnitResult]
Adapters = dict[str, LoRARequest]  # the worker's adapters by the model id a line names
Refused = Mapping[str, str]  # adapters in S3 that could not be fetched: the one-line reason their lines fail with


def run_unit(ctx: AppContext, unit_id: str, generator: Generator, worker: str,
             on_result: OnResult | None = None, incarnation: str | None = None,
             stopping: Callable[[], bool] = lambda: False,
             drain_at: Callable[[], float | None] = lambda: None) -> UnitOutcome:
    """stopping() says the worker is shutting down: a generation it interrupts raises UnitInterrupted.
    drain_at() is when a draining worker's engine must stop: what finished by then commits, the rest goes back
    to pending (not failed, no attempt counted: the unit itself is done)."""
    started = outage.start_step(ctx, unit_id, lambda: units.start_unit(ctx, unit_id, worker, incarnation))
    if started is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, to_run, prefix_key = started.attempt, started.to_run, started.prefix_key
    steps = outage.UnitSteps(ctx, unit_id, attempt)  # storage or the database down: wait, then release (never fail)
    requests = steps.storage("load its requests", lambda: _load_requests(ctx, unit_id, to_run))
    watch = UnitWatch(ctx, unit_id, attempt, [r for r, _ in requests], ctx.settings.abort_poll_s,
                      ctx.settings.progress_flush_s, drain_at)
    adapters, refused = steps.storage("fetch its adapters", lambda: unit_adapters(ctx.settings, requests))
    if ctx.settings.chunk_s > 0:  # finished requests kept as they finish, not only at the unit's end
        build = RecordBuilder(requests, generator, worker, adapters)
        watch.keep_chunks(UnitChunks(ctx, unit_id, attempt, watch.engine, build))
    with watch.watching(generator):  # live counts; stops a cancelled or expired job's requests
        records = _generate(requests, generator, worker, watch.listen(on_result), stopping, watch.aborts, adapters,
                            refused)
    work_tokens = sum(r.work_tokens for r in records.values())
    kept = watch.chunks.kept if watch.chunks is not None else set()
    rest = {key: rec for key, rec in records.items() if key not in kept}  # what no chunk of this run counted
    result_key = steps.storage("store its results",
                               lambda: record_store.store_results(ctx.storage, unit_id, attempt, rest))
    outcome = steps.database("commit", lambda: _commit(ctx, unit_id, result_key, rest, give_back=watch.drained))
    outcome.prefix_key, outcome.work_tokens = prefix_key, work_tokens
    outcome.adapters = tuple(dict.fromkeys(r.request.model for r, _ in requests if r.request.model in adapters))
    watch.finish(generator)
    if outcome.committed:
        jobs = sorted(({key.job_id for key in to_run} | outcome.jobs) - outcome.unfinished_jobs)
        # the fast path to a finished job; the sweep finalizes whatever this misses (a crash, storage down)
        outcome.finalized_jobs = tuple(j for j in jobs if try_finalize(ctx, j))
    return outcome


Running = tuple[UnitRequest, Origin]  # a request of the unit, and where it came from (its output line repeats it)


def unit_adapters(settings, requests: list[Running]) -> tuple[Adapters, dict[str, str]]:
    """The worker's adapters, those the unit's lines name in S3 fetched into the local cache (once per worker)."""
    return local_adapters(settings.lora_requests(), (r.request.model for r, _ in requests), settings.model_cache,
                          settings.max_adapter_bytes)


def _load_requests(ctx: AppContext, unit_id: str, to_run: dict[RequestKey, Origin]) -> list[Running]:
    return [(entry, to_run[entry.key]) for entry in record_store.read_unit_input(ctx.storage, unit_id, to_run)]


def _generate(requests: list[Running], generator: Generator, worker: str, on_result: EngineResult | None,
              stopping: Callable[[], bool] = lambda: False, aborts: Aborts | None = None,
              adapters: Adapters | None = None, refused: Refused | None = None) -> Records:
    """One engine call for the unit. A request the engine refuses fails alone (its result carries the
    error), and a batch that fails anyway is run again one request at a time."""
    records: Records = {}
    try:
        records.update(_run_batch(requests, generator, worker, on_result, aborts, adapters, refused))
    except Exception as exc:
        if stopping():
            raise UnitInterrupted(f"worker shutting down: {exc}") from exc
        if len(requests) == 1:
            r, origin = requests[0]
            log.warning("request %s failed in the engine: %s", r.key, _cause(exc))
            records[r.key] = _error_record(r, origin, "server_error", f"generation failed: {_cause(exc)}")
        else:
            log.warning("unit generation failed (%s); running its %d requests one at a time", _cause(exc), len(requests))
            for running in requests:
                records.update(_generate([running], generator, worker, on_result, stopping, aborts, adapters, refused))
    return records


def _run_batch(requests: list[Running], generator: Generator, worker: str, on_result: EngineResult | None,
               aborts: Aborts | None = None, adapters: Adapters | None = None, refused: Refused | None = None) -> Records:
    """Aborted requests get no record: the watch closed them (cancelled, expired) when it stopped them. Lines of an
    adapter that could not be fetched fail with its reason, as an engine's refusal."""
    if not requests:
        return {}
    engine = EngineRequests([r for r, _ in requests], adapters, refused)
    for failed in engine.refused:
        if on_result is not None:
            on_result(failed)
    results = engine.refused + (generator.generate(engine.generation, on_result=on_result, aborts=aborts)
                                if engine.generation else [])
    build = RecordBuilder(requests, generator, worker, adapters)
    records: Records = {}
    for key, found in engine.grouped(results):
        record = build(key, found)
        if record is not None:
            records[key] = record
    return records


class RecordBuilder:
    """A finished request's results record, from its engine results (every part's); None for an aborted one."""

    def __init__(self, requests: list[Running], generator: Generator, worker: str, adapters: Adapters | None = None):
        self.by_key = {r.key: (r, origin) for r, origin in requests}
        self.worker, self.generator, self.adapters = worker, generator, adapters
        self._described: dict | None = None

    @property
    def described(self) -> dict:
        """Which dtype and weights answered (outputs compare only within one); asked once an answer came."""
        if self._described is None:
            self._described = self.generator.description.metrics()
        return self._described

    def __call__(self, key: RequestKey, found: list[GenerationResult]) -> UnitResult | None:
        r, origin = self.by_key[key]
        if any(x.aborted for x in found):
            return None
        error = next((x.error for x in found if x.error), None)  # refused by the generator (engine.types.refusal): this request alone fails
        if error:
            return _error_record(r, origin, "invalid_request", error[:500])
        p = r.request
        line = formats.output_line(key.job_id, key.index, origin.custom_id, p.url, p.model, found, self.worker, p.echo)
        line["metrics"].update(self.described)
        if self.adapters and p.model in self.adapters:  # which adapter answered (the body's model names it too)
            line["metrics"]["adapter"] = p.model
        return UnitResult(r.job_id, p.index, origin.line, True, line, sum(x.prompt_tokens for x in found),
                          sum(x.completion_tokens for x in found), sum(x.cached_tokens for x in found),
                          kinds.reasoning_tokens(line["response"]["body"]))


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _error_record(r: UnitRequest, origin: Origin, code: str, message: str) -> UnitResult:
    return UnitResult(r.job_id, r.request.index, origin.line, False,
                      formats.error_line(r.job_id, r.request.index, origin.custom_id, code, message, origin.line))


def _commit(ctx: AppContext, unit_id: str, result_key: str, records: Records, give_back: bool = False) -> UnitOutcome:
    committed = units.commit_unit(ctx, unit_id, result_key, records, give_back)
    if committed is None:
        return UnitOutcome(unit_id, committed=False)
    return UnitOutcome(unit_id, committed=True, completed=committed.completed, failed=committed.failed,
                       unfinished_jobs=committed.unfinished_jobs, jobs=committed.jobs, given_back=committed.given_back)


def fail_unit(ctx: AppContext, unit_id: str, cause: str) -> UnitOutcome:
    """A unit that kept failing (its retries are spent): its open requests fail with server_error and the
    cause, into a results file like any run's, so the job can finish."""
    found = units.open_requests(ctx, unit_id)
    if found is None:
        return UnitOutcome(unit_id, committed=False)
    attempt, open_ = found[0] + 1, found[1]
    requests = _load_requests(ctx, unit_id, open_)
    message = f"the request failed {attempt - 1} times on the server: {cause}"[:500]
    records = {r.key: _error_record(r, origin, "server_error", message) for r, origin in requests}
    result_key = record_store.store_results(ctx.storage, unit_id, attempt, records)
    outcome = _commit(ctx, unit_id, result_key, records)
    if outcome.committed:
        log.error("unit %s failed for good: %d requests fail with server_error (%s)", unit_id, len(records), cause)
        for job_id in sorted({key.job_id for key in records}):
            try_finalize(ctx, job_id)
    return outcome

