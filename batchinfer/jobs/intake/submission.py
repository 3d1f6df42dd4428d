"""A new batch, whoever submits it (CLI or API): checked (its model, completion window, metadata and the
number of unfinished batches its owner may have), given its cache scope, recorded in `validating`, and its
input stored."""
from __future__ import annotations

import time
import uuid
from typing import BinaryIO

from sqlalchemy import func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.error_codes import invalid_type
from batchinfer.errors import BatchInferError, InvalidRequest, TooManyActive, excerpt, shown
from batchinfer.jobs import record_store
from batchinfer.jobs.idempotency import Claim
from batchinfer.jobs.endpoints.fields import MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE
from batchinfer.jobs.intake.lines import not_served
from batchinfer.jobs.served_models import served_models
from batchinfer.jobs.state import intake as state
from batchinfer.jobs.tenancy import scopes
from batchinfer.jobs.webhooks import events as webhook_events
from batchinfer.jobs.user_text import has_control
from batchinfer.jobs.webhooks.target import check_url
from batchinfer.settings import parse_duration


def new_job_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def create_job(ctx: AppContext, *, source: BinaryIO | None = None, input_key: str | None = None, filename: str = "",
               model: str | None = None, metadata: dict | None = None, completion_window: str | None = None,
               skip_invalid: bool = False, strict: bool = False, priority: int = 0, now: float | None = None,
               idempotency: Claim | None = None, **fields) -> Job:
    """A job row in `validating`. Its input is `input_key` when already stored (an uploaded file, not copied),
    else `source`, streamed to the job's own input key. `fields` are further Job columns (owner_id, ...).
    idempotency: the key the job is made under (committed with it; a concurrent create under the same key makes
    this one fail with IntegrityError, jobs.idempotency).
    If storing `source` fails, the job is failed at once naming the cause, and the error is raised."""
    if skip_invalid and strict:
        raise InvalidRequest("skip_invalid and strict cannot both be set: the one runs the valid lines of a file "
                             "with bad ones, the other runs nothing of it.", code="invalid_value", param="strict")
    model = check_model(ctx, model)
    window = completion_window_s(ctx, completion_window)
    metadata = check_metadata(ctx, metadata)
    check_active_limit(ctx, fields.get("owner_id"))
    fields["cache_scope"] = scopes.job_scope(ctx, fields.get("owner_id"))
    now = now or time.time()
    job_id = new_job_id()
    job = state.create_job(ctx, idempotency.row(job_id) if idempotency else None, id=job_id, model=model,
                           input_filename=filename, metadata_=metadata, skip_invalid=skip_invalid, strict=strict,
                           priority=priority, completion_window_s=window, created_at=now, expires_at=now + window,
                           input_key=input_key or record_store.job_input(job_id), errors=[], **fields)
    if source is not None:
        _store_input(ctx, job, source)
    return job


def _store_input(ctx: AppContext, job: Job, source: BinaryIO) -> None:
    try:
        ctx.storage.upload(job.input_key or record_store.job_input(job.id), source)
    except Exception as exc:  # storage down: the job can never run, so it ends now rather than at the sweep
        cause = f"could not store the input file: {type(exc).__name__}: {excerpt(str(exc))}"
        try:
            state.fail_validation(ctx, job.id, cause)
        except Exception:  # the database is down too: the sweep fails it once validation_stale_s has passed
            pass
        raise BatchInferError(f"batch {job.id}: {cause}") from exc


def check_model(ctx: AppContext, model: str | None) -> str:
    """A model the submit names must be served; none named: "" (validation takes the one the lines name)."""
    if not model:
        return ""
    served = served_models(ctx)
    if model not in served and ctx.settings.adapter_base(model) is None:
        raise InvalidRequest(not_served(model, served), code="model_not_found", param="model")
    return model


def completion_window_s(ctx: AppContext, window: str | None) -> float:
    """A window we serve: OpenAI's 24h, or (ours) any duration up to max_completion_window_s; never empty. None:
    the default (BATCHINFER_COMPLETION_WINDOW)."""
    try:
        return parse_duration(ctx.settings.completion_window if window is None else window,
                              ctx.settings.max_completion_window_s)
    except ValueError:
        longest = ctx.settings.max_completion_window_s
        # OpenAI's wording; the param and code end it too, as the openai SDK (2.x on) shows only the message
        raise InvalidRequest(f"Invalid value: {excerpt(repr(window), 40)}. Supported values are: '24h', or a duration of "
                             f"at most {longest / 86400:g} days such as '30m', '48h' or '2d' (param completion_window, "
                             "code invalid_value).", code="invalid_value", param="completion_window") from None


def check_metadata(ctx: AppContext, metadata: dict | None) -> dict:
    metadata = dict(metadata or {})
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"Invalid 'metadata': too many properties. Expected an object with at most "
                             f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} properties instead.",
                             code="invalid_value", param="metadata")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidRequest(invalid_type(f"metadata.{key}", "a string", value), code="invalid_type",
                                 param=f"metadata.{excerpt(str(key), 64)}")
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"Invalid 'metadata': metadata keys are at most {MAX_METADATA_KEY} characters and "
                                 f"values at most {MAX_METADATA_VALUE} ({shown(key)}).", code="invalid_value",
                                 param="metadata")
        if key != webhook_events.METADATA_KEY and (has_control(key) or has_control(value)):  # the URL: check_url below
            raise InvalidRequest(f"Invalid 'metadata': metadata keys and values may hold no control characters "
                                 f"({shown(key)}).", code="invalid_value", param="metadata")
    webhook_url = metadata.get(webhook_events.METADATA_KEY)
    if webhook_url:
        check_url(webhook_url, ctx.settings.webhook_allow_private)
    _check_error_rate(metadata)
    return metadata


def _check_error_rate(metadata: dict) -> None:
    """metadata.max_error_rate: a share in (0, 1]; max_error_rate_after: a count >= 1 (jobs.state.error_rate)."""
    rules = {"max_error_rate": (float, lambda v: 0 < v <= 1, "a number in (0, 1], as a string (\"0.2\")"),
             "max_error_rate_after": (int, lambda v: v >= 1, "an integer >= 1, as a string (\"50\")")}
    for key, (kind, ok, rule) in rules.items():
        if key not in metadata:
            continue
        try:
            good = ok(kind(metadata[key]))
        except ValueError:
            good = False
        if not good:
            raise InvalidRequest(f"Invalid 'metadata.{key}': expected {rule}, but got {shown(metadata[key])}.",
                                 code="invalid_value", param=f"metadata.{key}")


def check_active_limit(ctx: AppContext, owner_id: str | None) -> None:
    """An owner (None: the local CLI) may have max_active_batches_per_owner unfinished batches."""
    limit = ctx.settings.max_active_batches_per_owner
    mine = Job.owner_id.is_(None) if owner_id is None else Job.owner_id == owner_id
    with ctx.sessions() as session:
        active = session.scalar(select(func.count()).select_from(Job)
                                .where(mine, Job.status.not_in(JobStatus.TERMINAL))) or 0
    if active >= limit:
        raise TooManyActive(f"You have {active} unfinished batches; the limit is {limit}.")
