"""What every new batch is checked against, whoever submits it (CLI or API): its model, completion window,
metadata and the number of unfinished batches its owner may have."""
from __future__ import annotations

from sqlalchemy import func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Job, JobStatus
from batchinfer.errors import InvalidRequest, TooManyActive, shown
from batchinfer.jobs.endpoints.fields import MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE
from batchinfer.jobs.served_models import not_served, served_models
from batchinfer.jobs.webhooks import events as webhook_events
from batchinfer.jobs.user_text import has_control
from batchinfer.jobs.webhooks.target import check_url
from batchinfer.settings import parse_duration



def check_model(ctx: AppContext, model: str | None) -> str:
    """A model the submit names must be served; none named: "" (validation takes the one the lines name)."""
    if not model:
        return ""
    served = served_models(ctx)
    if model not in served:
        raise InvalidRequest(f"model_not_found: {not_served(model, served)}")
    return model


def completion_window_s(ctx: AppContext, window: str | None) -> float:
    try:
        return parse_duration(window or ctx.settings.completion_window, ctx.settings.max_completion_window_s)
    except ValueError as exc:
        raise InvalidRequest(f"invalid_completion_window: {exc}") from None


def check_metadata(ctx: AppContext, metadata: dict | None) -> dict:
    metadata = dict(metadata or {})
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"invalid_metadata: at most {MAX_METADATA_PAIRS} metadata pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidRequest(f"invalid_metadata: metadata keys and values are strings ({shown(key)})")
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"invalid_metadata: metadata keys are at most {MAX_METADATA_KEY} characters and "
                                 f"values at most {MAX_METADATA_VALUE} ({shown(key)})")
        if key != webhook_events.METADATA_KEY and (has_control(key) or has_control(value)):  # the URL: check_url below
            raise InvalidRequest(f"invalid_metadata: metadata keys and values may hold no control characters ({shown(key)})")
    webhook_url = metadata.get(webhook_events.METADATA_KEY)
    if webhook_url:
        check_url(webhook_url, ctx.settings.webhook_allow_private)
    return metadata


def check_active_limit(ctx: AppContext, owner_id: str | None) -> None:
    """An owner (None: the local CLI) may have max_active_batches_per_owner unfinished batches."""
    limit = ctx.settings.max_active_batches_per_owner
    mine = Job.owner_id.is_(None) if owner_id is None else Job.owner_id == owner_id
    with ctx.sessions() as session:
        active = session.scalar(select(func.count()).select_from(Job)
                                .where(mine, Job.status.not_in(JobStatus.TERMINAL))) or 0
    if active >= limit:
        raise TooManyActive(f"You have {active} unfinished batches; the limit is {limit}.")
