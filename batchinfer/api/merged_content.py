"""`?merged=true` on a batch's output file: the batch and its retries as one file (jobs.finalize.merged)."""
from __future__ import annotations

from fastapi.responses import StreamingResponse

from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.jobs import service
from batchinfer.jobs.files import OUTPUT_PREFIX
from batchinfer.jobs.finalize.merged import merged_lines


def merged_content(ctx: AppContext, owner: str, file_id: str) -> StreamingResponse:
    if not file_id.startswith(OUTPUT_PREFIX):
        raise APIError(400, "merged=true applies to a batch's output file only.", "invalid_value", "merged")
    job_id = "batch_" + file_id.removeprefix(OUTPUT_PREFIX)
    lines = merged_lines(ctx, service.get(ctx, job_id, owner=owner))
    first = next(lines, b"")  # a storage error surfaces before the response starts
    return StreamingResponse(_chain(first, lines), media_type="application/jsonl")


def _chain(first: bytes, rest):
    if first:
        yield first
    yield from rest
