"""Anthropic's Message Batches API (/v1/messages/batches) over the same job system: `x-api-key` with the
same keys and tenants, and every error in Anthropic's shape {"type": "error", "error": {"type", "message"}}."""
from __future__ import annotations

from contextlib import contextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from batchinfer.api.auth import context
from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError, InvalidRequest, JobConflict, JobNotFound, TooManyActive
from batchinfer.jobs import message_batches, service
from batchinfer.jobs.tenancy import tenants
from batchinfer.jobs.endpoints.anthropic import parse_create
from batchinfer.jobs.views.anthropic_view import message_batch, results

router = APIRouter(prefix="/v1/messages/batches")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error"}
MAX_LIMIT = 1000


class AnthropicError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def install(app: FastAPI) -> None:
    """Route and error handler: one call from create_app."""
    @app.exception_handler(AnthropicError)
    async def _reply(_: Request, exc: AnthropicError):
        kind = ERROR_TYPES.get(exc.status, "api_error")
        return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message[:1000]}},
                            status_code=exc.status)

    app.include_router(router)


@contextmanager
def _anthropic_errors():
    """The job service's errors (and the shared checks' APIError) in Anthropic's shape."""
    try:
        yield
    except AnthropicError:
        raise
    except APIError as exc:
        raise AnthropicError(exc.status, exc.message) from None
    except JobNotFound as exc:
        raise AnthropicError(404, str(exc)) from None
    except TooManyActive as exc:
        raise AnthropicError(429, str(exc)) from None
    except JobConflict as exc:
        raise AnthropicError(400, str(exc)) from None  # Anthropic answers a wrong state with 400
    except (InvalidRequest, BatchInferError) as exc:
        raise AnthropicError(400, str(exc)) from None


def owner(request: Request, ctx: AppContext = Depends(context)) -> str:
    """The key from `x-api-key` (Anthropic's header), or a Bearer token as the OpenAI API takes it."""
    secret = request.headers.get("x-api-key", "").strip()
    if not secret:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        secret = token.strip() if scheme.lower() == "bearer" else ""
    if not secret:
        raise AnthropicError(401, "Missing API key: send it in the 'x-api-key' header.")
    key = tenants.authenticate(ctx, secret)
    if key is None:
        raise AnthropicError(401, "Incorrect or revoked API key.")
    return key.id


def _base_url(request: Request) -> str:
    return str(request.base_url)


@router.post("")
async def create(request: Request, ctx: AppContext = Depends(context), tenant: str = Depends(owner)) -> dict:
    raw = await request.body()  # the guard cut it off past max_message_batch_bytes
    if len(raw) > ctx.settings.max_message_batch_bytes:
        raise AnthropicError(413, f"The batch is over the {ctx.settings.max_message_batch_bytes}-byte limit.")
    with _anthropic_errors():
        body = parse_create(raw, ctx.settings.max_requests_per_file)
        job = await run_in_threadpool(message_batches.create, ctx, tenant, body)
    request.app.state.work.validate(job.id, job.owner_id or "")
    return message_batch(ctx, job, _base_url(request))


@router.get("")
def list_batches(request: Request, ctx: AppContext = Depends(context), tenant: str = Depends(owner),
                 before_id: str | None = None, after_id: str | None = None, limit: str = "20") -> dict:
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIMIT:
        raise AnthropicError(400, f"limit: must be an integer from 1 to {MAX_LIMIT}")
    if before_id and after_id:
        raise AnthropicError(400, "before_id and after_id cannot both be given")
    with _anthropic_errors():
        jobs = message_batches.list_page(ctx, tenant, int(limit), after_id, before_id)
    shown = [message_batch(ctx, j, _base_url(request)) for j in jobs[:int(limit)]]
    return {"data": shown, "has_more": len(jobs) > int(limit), "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None}


@router.get("/{batch_id}")
def retrieve(batch_id: str, request: Request, ctx: AppContext = Depends(context), tenant: str = Depends(owner)) -> dict:
    with _anthropic_errors():
        return message_batch(ctx, message_batches.get(ctx, tenant, batch_id), _base_url(request))


@router.post("/{batch_id}/cancel")
def cancel(batch_id: str, request: Request, ctx: AppContext = Depends(context), tenant: str = Depends(owner)) -> dict:
    """Cancelling a batch already cancelling or ended answers with it as it is."""
    with _anthropic_errors():
        job = message_batches.get(ctx, tenant, batch_id)
        try:
            job = service.cancel(ctx, job.id, owner=tenant)
        except JobConflict:
            job = message_batches.get(ctx, tenant, batch_id)
        return message_batch(ctx, job, _base_url(request))


@router.delete("/{batch_id}")
def delete(batch_id: str, ctx: AppContext = Depends(context), tenant: str = Depends(owner)) -> dict:
    with _anthropic_errors():
        message_batches.delete(ctx, tenant, batch_id)
    return {"id": batch_id, "type": "message_batch_deleted"}


@router.get("/{batch_id}/results")
def batch_results(batch_id: str, ctx: AppContext = Depends(context), tenant: str = Depends(owner)) -> StreamingResponse:
    with _anthropic_errors():
        job = message_batches.get(ctx, tenant, batch_id)
    if job.status not in JobStatus.TERMINAL:
        raise AnthropicError(400, f"message batch {batch_id[:80]} is still processing; its results are ready "
                                  "once it has ended")
    return StreamingResponse(results(ctx, job), media_type="application/x-jsonl")
