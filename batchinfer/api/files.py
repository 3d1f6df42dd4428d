"""/v1/files: upload (multipart, streamed to storage), list, retrieve, content (streamed), delete."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from batchinfer.api.auth import context, owner_id
from batchinfer.api.errors import APIError
from batchinfer.api.pages import page
from batchinfer.context import AppContext
from batchinfer.error_codes import invalid_value, missing
from batchinfer.errors import shown
from batchinfer.jobs import files, idempotency
from batchinfer.jobs.files import FileTooLarge, FileView
from batchinfer.api.merged_content import merged_content
from batchinfer.jobs.user_text import has_control

router = APIRouter(prefix="/v1/files")
MAX_FILENAME = 255


def file_object(view: FileView) -> dict:
    return {"id": view.id, "object": "file", "bytes": view.bytes, "created_at": int(view.created_at),
            "filename": view.filename, "purpose": view.purpose, "status": "processed",
            "expires_at": int(view.expires_at) if view.expires_at else None, "status_details": None}


@router.post("")
async def upload(request: Request, ctx: AppContext = Depends(context), owner: str = Depends(owner_id)) -> dict:
    # The guard has cut the body at max_file_bytes + its multipart envelope. Starlette spools the part to a
    # temporary file (1 MB in memory at most); we stream it on to storage.
    form = await request.form(max_files=1, max_fields=4)
    try:
        purpose, upload_file = form.get("purpose"), form.get("file")
        if purpose is None:
            raise APIError(400, missing("purpose"), "missing_required_parameter", "purpose")
        if purpose != "batch":
            raise APIError(400, f"{invalid_value(shown(purpose), ['batch'])} (the files of batches are the ones served)",
                           "invalid_value", "purpose")
        if upload_file is None or isinstance(upload_file, str):
            raise APIError(400, missing("file"), "missing_required_parameter", "file")
        filename = upload_file.filename or "upload.jsonl"
        if len(filename) > MAX_FILENAME or has_control(filename):
            raise APIError(400, f"Invalid value for 'file': its filename must be at most {MAX_FILENAME} characters "
                                "with no control characters.", "invalid_value", "file")
        key = idempotency.the_key(request.headers.get("idempotency-key"), _text(form.get("idempotency_key")))
        view = await run_in_threadpool(files.upload, ctx, owner, upload_file.file, filename, "batch", key)
    except FileTooLarge as exc:
        raise APIError(413, str(exc).split(": ", 1)[-1], "file_too_large", "file") from exc
    finally:
        await form.close()
    return file_object(view)


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


@router.get("")
def list_files(ctx: AppContext = Depends(context), owner: str = Depends(owner_id), after: str | None = None,
               limit: int = Query(100, ge=1, le=10000), order: Literal["asc", "desc"] = "desc",
               purpose: str | None = None) -> dict:
    views = files.list_files(ctx, owner, limit + 1, after, order, purpose)
    return page([file_object(v) for v in views], limit)


@router.get("/{file_id}")
def retrieve(file_id: str, ctx: AppContext = Depends(context), owner: str = Depends(owner_id)) -> dict:
    return file_object(files.get(ctx, owner, file_id))


@router.get("/{file_id}/content")
def content(file_id: str, ctx: AppContext = Depends(context), owner: str = Depends(owner_id),
            merged: bool = False) -> StreamingResponse:
    view = files.get(ctx, owner, file_id)
    if merged:  # ours: the batch's output with its retries' (jobs.finalize.merged)
        return merged_content(ctx, owner, file_id)

    def chunks():
        with ctx.storage.open_read(view.storage_key) as stream:
            while chunk := stream.read(files.CHUNK):
                yield chunk

    return StreamingResponse(chunks(), media_type="application/jsonl", headers={"content-length": str(view.bytes)})


@router.delete("/{file_id}")
def delete(file_id: str, ctx: AppContext = Depends(context), owner: str = Depends(owner_id)) -> dict:
    files.delete(ctx, owner, file_id)
    return {"id": file_id, "object": "file", "deleted": True}
