"""Validate a stored job: the one path, with one error policy, whoever asks (CLI submit, the API, a worker's
validate_job task, the sweep).

The policy: a fault that may pass (the database or storage unreachable) leaves the job `validating` and
raises ValidationDeferred, and the sweep validates it again later; any other failure fails the job, naming
its cause, and returns it.
"""
from __future__ import annotations

import logging
from dataclasses import replace
import time
from typing import Callable

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.error_codes import batch_not_found
from batchinfer.errors import BatchInferError, JobNotFound, excerpt, one_line, shown
from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs import record_store
from batchinfer.jobs.faults import is_transient, service_of
from batchinfer.jobs.finalize.finalize import try_finalize
from batchinfer.jobs.state import intake as state
from batchinfer.jobs.endpoints.anthropic import MESSAGES_ENDPOINT
from batchinfer.jobs.intake.tokenizer import sampling_defaults, tokenizer_and_context
from batchinfer.jobs.intake.lines import ValidationLimits, ValidLine, peek_model, unserved_model_report, validate_stream
from batchinfer.jobs.records import LineError, ValidationReport
from batchinfer.jobs.served_models import ServedModel, model_settings, served_models
from batchinfer.settings import Settings
from batchinfer.jobs import outage

log = logging.getLogger(__name__)
INSERT_BATCH = 1000
BEAT_S = 5.0  # a validation renews its lease at least this often, also through a long run of invalid lines


class ValidationDeferred(BatchInferError):
    """The job is kept `validating`: a fault that may pass stopped its validation, and the sweep resumes it."""


def validate_job(ctx: AppContext, job_id: str, on_rows: Callable[[], None] | None = None) -> Job:
    """Validate a `validating` job's stored input and move it on to queued or failed; returns the job.
    Idempotent and resumable: each run claims the job and starts clean (a crashed run's request rows are
    dropped), request rows are committed in batches, and a run that lost its claim stops. A cancel that
    lands meanwhile wins: the job ends cancelled and is never set back to queued.
    on_rows: asks for a dispatch once the first rows are committed (only with settings.stream_dispatch)."""
    try:
        return _validate_job(ctx, job_id, on_rows)
    except JobNotFound:
        raise
    except Exception as exc:
        return _failed(ctx, job_id, exc)


def _validate_job(ctx: AppContext, job_id: str, on_rows: Callable[[], None] | None) -> Job:
    token = state.claim_validation(ctx, job_id)
    if token is None:
        return _get(ctx, job_id)
    job = _get(ctx, job_id)
    try:
        report = _validate(ctx, job, token, on_rows)
    except state.ValidationSuperseded:
        return _get(ctx, job_id)
    job = state.finish_validation(ctx, job_id, token, report, _runs(job, report))
    if job.status in (JobStatus.QUEUED, JobStatus.IN_PROGRESS):
        _refresh_statistics(ctx, report.valid)
    if job.status == JobStatus.IN_PROGRESS or (job.status == JobStatus.QUEUED and (ctx.settings.stream_dispatch
                                                                                   or report.valid == 0)):
        # streamed: its units ran before the queue move, maybe all of them (QUEUED too: a unit that started while
        # the move held the job row is not seen by it); no valid line (every body refused): nothing to run
        try_finalize(ctx, job_id)
    return job


def _refresh_statistics(ctx: AppContext, rows: int) -> None:
    try:
        state.refresh_statistics(ctx, rows)
    except Exception as exc:  # an optimisation: the job is queued whether or not it ran
        log.warning("could not refresh the requests table's statistics: %s", one_line(exc))


def _failed(ctx: AppContext, job_id: str, exc: Exception) -> Job:
    if is_transient(exc):
        _report(ctx, exc)
        raise ValidationDeferred(_deferred(ctx, job_id, exc)) from exc
    if isinstance(exc, FileNotFoundError) and not _input_stored(ctx, job_id):
        cause = "the input file was never stored (the submit was interrupted)"
    elif isinstance(exc, ModelUnavailable):
        cause = str(exc)
    elif isinstance(exc, BatchInferError):  # our own words, about the file
        cause = f"validation failed: {excerpt(str(exc)) or 'an internal error'}"
    else:  # never an internal message (a path, SQL, a class name) in what the tenant reads
        cause = "validation failed: an internal error (the server's log has the detail)"
    log.warning("job %s fails: %s (%s: %s)", job_id, cause, type(exc).__name__, one_line(exc))
    try:
        state.fail_validation(ctx, job_id, cause)
        return _get(ctx, job_id)
    except Exception as again:  # the database or storage went away meanwhile: the next sweep tries again
        raise ValidationDeferred(_deferred(ctx, job_id, again)) from again


def _report(ctx: AppContext, exc: BaseException) -> None:
    service = service_of(exc)
    if service is not None:
        outage.report_down(ctx, service, exc)


def _deferred(ctx: AppContext, job_id: str, exc: BaseException) -> str:
    """The one line a person sees (the CLI prints it); callers that keep going log the cause (deferred_cause)."""
    return (f"job {job_id} is stored, but its validation stopped (storage or the database is unreachable); it is "
            f"validated again once {ctx.settings.validation_stale_s:g} s pass with both back")


def deferred_cause(exc: ValidationDeferred) -> str:
    """What stopped a deferred validation, for the log (never shown to users: it may name hosts and paths)."""
    return one_line(exc.__cause__) if exc.__cause__ is not None else ""


def _get(ctx: AppContext, job_id: str) -> Job:
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(batch_not_found(shown(job_id)))
    return job


def _input_stored(ctx: AppContext, job_id: str) -> bool:
    job = _get(ctx, job_id)
    return job.input_key is not None and ctx.storage.exists(job.input_key)


def validation_limits(s: Settings, max_model_len: int, served: tuple[str, ...] = ()) -> ValidationLimits:
    """s: the settings of the batch's model (served_models.model_settings)."""
    return ValidationLimits(model_id=s.model_id, max_model_len=max_model_len, max_requests=s.max_requests_per_file,
                            max_line_bytes=s.max_line_bytes, max_file_bytes=s.max_file_bytes,
                            default_max_tokens=s.default_max_tokens, max_errors_kept=s.max_errors_kept,
                            served_models=served, sampling_defaults=sampling_defaults(s), adapters=tuple(s.adapters))


def checked_with(ctx: AppContext, model: str, served: dict[str, ServedModel]) -> tuple[object, ValidationLimits] | None:
    """(tokenizer, limits) a file whose batch model is `model` is validated with. A model nobody serves: the lines
    are checked on a served model's tokenizer (the default's, else the first), each line naming it reported with
    its line (model_not_found), so the file's other problems are named too; None when no model is served at all."""
    checked_on = model if model in served else ctx.settings.model_id if ctx.settings.model_id in served else next(
        iter(served), None)
    if checked_on is None:
        return None
    settings, tokenizer, max_model_len = model_tokenizer(ctx, served[checked_on])
    limits = validation_limits(settings, max_model_len, tuple(served))
    if checked_on != model:
        limits.model_id, limits.model_served = model, False
    return tokenizer, limits


class ModelUnavailable(BatchInferError):
    """The batch's model is served, but its checkpoint is not readable where validation runs."""


def batch_model(ctx: AppContext, named: str | None, submitted: str = "") -> str:
    """The batch's model: the one its submit named, else the one its first line names, else this process's
    default (lines may leave `model` out). An adapter's batch is its base's: its lines may name the base or any of
    its adapters."""
    model = submitted or named or ctx.settings.model_id
    return ctx.settings.adapter_base(model) or model


def model_tokenizer(ctx: AppContext, model: ServedModel):
    """(settings, tokenizer, context length) of the batch's model; its weights are not loaded."""
    settings = model_settings(ctx.settings, model)
    try:
        tokenizer, max_model_len = tokenizer_and_context(settings)
    except FileNotFoundError:  # a path only a worker on another machine has: the message names no path
        where = "its path in BATCHINFER_MODELS" if model.configured else "the path it is served from"
        raise ModelUnavailable(f"model {model.id!r} is served, but its tokenizer is not readable where this batch "
                               f"is validated ({where} is missing here)") from None
    return settings, tokenizer, max_model_len


def _input_key(job: Job) -> str:
    """The job's input: the key create_job set (the column is nullable), else the default one."""
    return job.input_key or record_store.job_input(job.id)


def _validate(ctx: AppContext, job: Job, token: str, on_rows: Callable[[], None] | None = None) -> ValidationReport:
    """Stream the stored input; valid lines go to the prepared parts and the requests table, bad ones to the
    invalid lines. A batch whose model nobody serves fails whole, naming the served models."""
    try:
        served: dict[str, ServedModel] | None = served_models(ctx)
    except ConnectionError:  # the registry (the broker) is down: enough when this process serves the batch's model
        served = None
    with (ctx.storage.open_read(_input_key(job)) as stored,
          ctx.storage.open_write(record_store.job_invalid(job.id)) as invalid):
        named, source = peek_model(stored, ctx.settings.max_line_bytes)
        model = batch_model(ctx, named, job.model)
        if served is None:
            if model not in ctx.settings.configured_models:
                raise ConnectionError("the worker registry is unreachable: the batch's model may be served by a worker")
            served = served_models(replace(ctx, live_models=None))
        if model not in served and job.endpoint == MESSAGES_ENDPOINT:
            model = ctx.settings.model_id  # Anthropic's requests succeed or fail alone: its line fails, not the batch
        rows = _Rows(ctx, job.id, token, model, on_rows if ctx.settings.stream_dispatch else None)

        def on_invalid(error: LineError) -> None:  # a refused body: the request's own 400
            invalid.write(formats.dumps(formats.error_line(job.id, None, error.custom_id, error.code, error.message,
                                                           error.line, error.param, 400 if error.per_request else None)))
            rows.beat()

        checked = checked_with(ctx, model, served)
        if checked is not None:
            tokenizer, limits = checked
            limits.endpoint, limits.strict = job.endpoint, bool(job.strict)
            report = validate_stream(source, tokenizer, limits, rows.add, on_invalid, rows.beat)
        else:
            report = unserved_model_report(model, served)
        rows.close()  # also the last check that this run still owns the job
    report.model = model
    return report


class _Rows:
    """Valid lines on their way to the prepared parts and the requests table. Each part is stored before the rows it
    holds are committed; each commit renews the lease and notices a cancel.

    Streaming (on_rows given, settings.stream_dispatch): rows are committed a part at a time, so a dispatch may plan
    them while the file is still validated; on_rows is called once, after the first part's rows are committed.
    Otherwise rows go every INSERT_BATCH (or BEAT_S), and nothing reads them before the queue move."""

    def __init__(self, ctx: AppContext, job_id: str, token: str, model: str, on_rows: Callable[[], None] | None):
        self.ctx, self.job_id, self.token, self.model, self.on_rows = ctx, job_id, token, model, on_rows
        self.asked = False  # on_rows is called once: the dispatch's rounds follow the file from there
        self.rows: list[dict] = []
        self.lines: list[bytes] = []
        self.part = 0
        self.beat_at = time.monotonic()

    @property
    def streaming(self) -> bool:
        return self.on_rows is not None

    def add(self, valid: ValidLine) -> None:
        if record_store.part_of(valid.request.index) != self.part:
            self._store_part()
            self.part = record_store.part_of(valid.request.index)
        self.rows.append({"job_id": self.job_id, "index": valid.request.index, "line": valid.line,
                          "custom_id": valid.custom_id})
        self.lines.append(valid.request.to_json() + b"\n")
        self.beat()

    def beat(self) -> None:
        if not self.streaming and len(self.rows) >= INSERT_BATCH:
            self._commit(self.rows)
        elif time.monotonic() - self.beat_at >= BEAT_S:  # streaming: the heartbeat only, rows wait for their part
            self._commit([] if self.streaming else self.rows)

    def close(self) -> None:
        self._store_part(last=True)
        if not self.streaming:
            self._commit(self.rows)

    def _commit(self, rows: list[dict]) -> None:
        state.add_requests(self.ctx, self.job_id, self.token, rows, self.model)
        self.beat_at = time.monotonic()

    def _store_part(self, last: bool = False) -> None:
        if self.lines:
            record_store.store_part(self.ctx.storage, self.job_id, self.part, self.lines)
            self.lines.clear()
        if not self.streaming:
            return
        committed = len(self.rows)
        self._commit(self.rows)
        if committed and not last and self.on_rows is not None and not self.asked:
            _refresh_statistics(self.ctx, committed)  # the claims made on these rows plan on them (no empty job)
            self.asked = True
            try:  # a dispatch asked early; the queue move asks again, so a broker down here costs only the overlap
                self.on_rows()
            except Exception as exc:
                log.warning("job %s: could not ask for a dispatch while validating: %s", self.job_id, one_line(exc))


def _runs(job: Job, report: ValidationReport) -> bool:
    """No problem that fails the batch (or skip_invalid, and none of the file), and some request to run or to fail
    alone (a batch whose every body is refused completes, each request with its 400, as OpenAI's does)."""
    return (report.valid + report.refused) > 0 and (report.ok or (job.skip_invalid and not report.file_error))
