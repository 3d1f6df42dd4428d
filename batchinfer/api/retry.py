"""POST /v1/batches/{id}/retry (ours): a new batch of the original lines that did not succeed."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from batchinfer.api.auth import context, owner_id
from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.jobs.views.batch_view import batch_object
from batchinfer.jobs.retry import create_retry
from batchinfer.settings import parse_duration

router = APIRouter(prefix="/v1/batches")


class RetryRequest(BaseModel):
    error_codes: list[str] | None = Field(None, max_length=32)  # only requests that failed with one of these
    completion_window: str | None = None  # default: the server's (not the original's, which may have expired)


@router.post("/{batch_id}/retry")
def retry(batch_id: str, request: Request, spec: RetryRequest | None = None, ctx: AppContext = Depends(context),
          owner: str = Depends(owner_id)) -> dict:
    spec = spec or RetryRequest(error_codes=None, completion_window=None)
    if spec.completion_window is not None:
        try:
            parse_duration(spec.completion_window)
        except ValueError as exc:
            raise APIError(400, str(exc), "invalid_value", "completion_window") from exc
    job = create_retry(ctx, batch_id, owner, set(spec.error_codes) if spec.error_codes else None,
                       spec.completion_window)
    request.app.state.work.validate(job.id, job.owner_id or "")
    return batch_object(job)
