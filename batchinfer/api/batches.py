"""/v1/batches: create (answers at once, `validating`), list, retrieve, cancel; and our extras,
prefix-group progress and the dry-run estimate."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from batchinfer import error_codes as E
from batchinfer.api.auth import api_key, context, owner_id
from batchinfer.api.errors import APIError
from batchinfer.api.pages import page
from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey, Job, JobStatus
from batchinfer.errors import JobNotFound
from batchinfer.errors import shown as shown_value
from batchinfer.jobs import files, idempotency, service
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.jobs.units.live import with_live
from batchinfer.runtime.preview import estimate_key, worker_count
from batchinfer.jobs.views.eta import batch_with_eta
from batchinfer.jobs.dispatch.planning import planner_config
from batchinfer.jobs.views.reports import group_figures, unit_figures

router = APIRouter(prefix="/v1/batches")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


class OutputExpiresAfter(BaseModel):
    anchor: str = "created_at"
    seconds: int = Field(ge=3600, le=30 * 86400)


class CreateBatch(BaseModel):
    input_file_id: str = Field(max_length=64)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiresAfter | None = None
    skip_invalid: bool = False  # ours: run the valid lines; bad ones go to the error file
    strict: bool = False  # ours: a body the endpoint refuses fails the batch too (the CLI's --strict)
    idempotency_key: str | None = None  # the Idempotency-Key header, in the body (Llama Stack's spelling)

    def request_hash(self) -> str:
        """What makes two creates under one key the same request (metadata in any order)."""
        return idempotency.request_hash(self.model_dump(exclude={"idempotency_key"}))


class EstimateRequest(BaseModel):
    input_file_id: str = Field(max_length=64)


@router.post("")
def create(spec: CreateBatch, request: Request, ctx: AppContext = Depends(context),
           owner: str = Depends(owner_id)) -> dict:
    """As OpenAI's: a file that cannot be found makes a batch failed with invalid_request (service.create_from_file);
    with an idempotency key, a retry of the same create answers with the batch it made (jobs.idempotency)."""
    key = idempotency.the_key(request.headers.get("idempotency-key"), spec.idempotency_key)
    if spec.endpoint not in ENDPOINTS:
        # OpenAI's wording; the code and param end it too, as the openai SDK (2.x on) shows only the message
        raise APIError(400, f"{E.invalid_value(shown_value(spec.endpoint), sorted(ENDPOINTS))} (param endpoint, code "
                            "invalid_value)", "invalid_value", "endpoint")

    def make(claim: idempotency.Claim | None) -> Job:
        expires = spec.output_expires_after.seconds if spec.output_expires_after else None
        return service.create_from_file(ctx, owner, spec.input_file_id, claim, metadata=spec.metadata,
                                        completion_window=spec.completion_window, skip_invalid=spec.skip_invalid,
                                        strict=spec.strict, endpoint=spec.endpoint, output_expires_after_s=expires)

    if key is None:
        job, made = make(None), True
    else:
        claim = idempotency.Claim(owner, "batches", key, spec.request_hash())
        job, made = idempotency.once(ctx, claim, lambda batch_id: _kept_batch(ctx, owner, batch_id), make)
    if made and job.status == JobStatus.VALIDATING:
        request.app.state.work.validate(job.id, job.owner_id or "")
    return batch_object(job)


def _kept_batch(ctx: AppContext, owner: str, batch_id: str) -> Job | None:
    try:
        return with_live(ctx, [service.get(ctx, batch_id, owner=owner)])[0]
    except JobNotFound:
        return None


def _input_file(ctx: AppContext, owner: str, file_id: str) -> files.FileView:
    try:
        upload = files.get(ctx, owner, file_id)
    except JobNotFound as exc:
        raise APIError(404, E.file_not_found(shown_value(file_id)), "not_found", "input_file_id") from exc
    if upload.purpose != "batch":
        raise APIError(400, "input_file_id must be a file uploaded with purpose 'batch'.", "invalid_value", "input_file_id")
    return upload


def scope(key: ApiKey = Depends(api_key)):
    """Whose batches a key may read and cancel: an admin key every batch (the local CLI's too), others their own."""
    return service.ANY_OWNER if key.is_admin else key.id


def shown(ctx: AppContext, jobs: list[Job]) -> list[dict]:
    """Batch objects with the live counts of their running units."""
    return [batch_object(j) for j in with_live(ctx, jobs)]


@router.get("")
def list_batches(ctx: AppContext = Depends(context), owner: str = Depends(owner_id), key: ApiKey = Depends(api_key),
                 after: str | None = None, limit: int = Query(20, ge=1, le=100),
                 all: bool = Query(False, description="admin keys: every batch, not only the key's own")) -> dict:
    if all and not key.is_admin:
        raise APIError(403, "Only an admin key lists every batch (batchinfer keys create --admin).", "not_admin", "all")
    jobs = service.list_jobs(ctx, limit + 1, owner=service.ANY_OWNER if all else owner, after=after)
    return page(shown(ctx, jobs), limit)


@router.post("/estimate")
async def estimate(spec: EstimateRequest, request: Request, ctx: AppContext = Depends(context),
                   owner: str = Depends(owner_id)) -> dict:
    """What the file would cost (requests, tokens, prefix groups, expected cached tokens, run time); runs nothing.
    A worker tokenizes it: the API process holds no tokenizer."""
    upload = _input_file(ctx, owner, spec.input_file_id)
    key = estimate_key(await asyncio.to_thread(request.app.state.work.estimate, upload.storage_key, owner))
    deadline = time.time() + ctx.settings.api_estimate_wait_s
    while time.time() < deadline:
        if await asyncio.to_thread(ctx.storage.exists, key):
            result = json.loads(await asyncio.to_thread(_read, ctx, key))
            await asyncio.to_thread(ctx.storage.delete, key)
            if "error" in result:
                raise APIError(400, result["error"], "estimate_failed", "input_file_id")
            return {"object": "batch.estimate", "input_file_id": upload.id, **result}
        await asyncio.sleep(0.2)
    raise APIError(503, "No estimate came back in time; try again later.", "estimate_timeout")


def _read(ctx: AppContext, key: str) -> bytes:
    with ctx.storage.open_read(key) as stream:
        return stream.read()


@router.get("/{batch_id}")
def retrieve(batch_id: str, ctx: AppContext = Depends(context), owner=Depends(scope)) -> dict:
    """The batch with live counts; before its first request finishes, also the plan's ETA (jobs.views.eta)."""
    job = with_live(ctx, [service.get(ctx, batch_id, owner=owner)])[0]
    return batch_with_eta(ctx, job, planner_config(ctx), worker_count(ctx))


@router.post("/{batch_id}/cancel")
def cancel(batch_id: str, ctx: AppContext = Depends(context), owner=Depends(scope)) -> dict:
    return shown(ctx, [service.cancel(ctx, batch_id, owner=owner)])[0]


@router.post("/{batch_id}/pause")
def pause(batch_id: str, ctx: AppContext = Depends(context), owner=Depends(scope)) -> dict:
    """Ours: no new unit starts, running ones finish, the window keeps running (409 unless queued or in_progress)."""
    return shown(ctx, [service.pause(ctx, batch_id, owner=owner)])[0]


@router.post("/{batch_id}/resume")
def resume(batch_id: str, request: Request, ctx: AppContext = Depends(context), owner=Depends(scope)) -> dict:
    """Ours: a paused batch runs again (409 unless paused or running)."""
    job = service.resume(ctx, batch_id, owner=owner)
    if job.status in JobStatus.RUNNABLE:
        request.app.state.work.dispatch_soon()
    return shown(ctx, [job])[0]


@router.get("/{batch_id}/prefix_groups")
def prefix_groups(batch_id: str, ctx: AppContext = Depends(context), owner=Depends(scope)) -> dict:
    service.get(ctx, batch_id, owner=owner)
    units = unit_figures(ctx, batch_id)
    return {"object": "list", "batch_id": batch_id, "data": [g.to_dict() for g in group_figures(units)]}
