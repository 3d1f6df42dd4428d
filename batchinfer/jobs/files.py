"""Files of a tenant: uploads (purpose `batch`) and the output and error files of its batches.

A batch's result files need no rows of their own: their ids are derived from the batch id, and the owner
check is the batch's. Its owner may delete them once the batch has ended (the batch keeps their ids).
"""
from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import File, Job
from batchinfer.db.session import transaction
from batchinfer.errors import BatchInferError, JobNotFound, shown
from batchinfer.jobs import idempotency
from batchinfer.jobs.state.ending import forget_result_file

OUTPUT_PREFIX, ERROR_PREFIX = "file-out-", "file-err-"
CHUNK = 1024 * 1024


class FileTooLarge(BatchInferError):
    pass


@dataclass
class FileView:
    """What the API shows of a file, uploaded or produced."""

    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: float
    storage_key: str
    expires_at: float | None = None


def output_file_id(job_id: str) -> str:
    return OUTPUT_PREFIX + job_id.removeprefix("batch_")


def error_file_id(job_id: str) -> str:
    return ERROR_PREFIX + job_id.removeprefix("batch_")


class _Counted:
    """Reads through, counting and hashing bytes, and stops a stream that grows past the limit."""

    def __init__(self, source: BinaryIO, limit: int):
        self.source, self.limit, self.count = source, limit, 0
        self.digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n if n and n > 0 else CHUNK)
        self.count += len(data)
        if self.count > self.limit:
            raise FileTooLarge(f"file_too_large: the file is over the {self.limit}-byte limit")
        self.digest.update(data)
        return data


def upload(ctx: AppContext, owner_id: str, source: BinaryIO, filename: str, purpose: str = "batch",
           idempotency_key: str | None = None) -> FileView:
    """The file, stored. With an idempotency key: the same key with the same file (bytes, name and purpose) answers
    with the file that key made, and the bytes just stored are dropped; another file under it is a conflict."""
    file_id = f"file-{uuid.uuid4().hex}"
    key = f"files/{file_id}"
    counted = _Counted(source, ctx.settings.max_file_bytes)
    ctx.storage.upload(key, counted)  # a failed upload leaves nothing: writers commit on a clean exit only
    row = File(id=file_id, owner_id=owner_id, filename=filename[:512], purpose=purpose, bytes=counted.count,
               storage_key=key, created_at=time.time())

    def make(claim: idempotency.Claim | None) -> FileView:
        with transaction(ctx.sessions) as session:
            session.add(row)
            if claim is not None:
                session.add(claim.row(file_id))
        return _view(row)

    if idempotency_key is None:
        return make(None)
    request = {"purpose": purpose, "filename": row.filename, "sha256": counted.digest.hexdigest()}
    claim = idempotency.Claim(owner_id, "files", idempotency_key, idempotency.request_hash(request))
    try:
        view, made = idempotency.once(ctx, claim, lambda found: _kept_upload(ctx, owner_id, found), make)
    except BaseException:
        ctx.storage.delete(key)
        raise
    if not made:
        ctx.storage.delete(key)
    return view


def _kept_upload(ctx: AppContext, owner_id: str, file_id: str) -> FileView | None:
    try:
        return get(ctx, owner_id, file_id)
    except JobNotFound:
        return None


def _view(row: File) -> FileView:
    return FileView(row.id, row.filename, row.purpose, row.bytes, row.created_at, row.storage_key)


def get(ctx: AppContext, owner_id: str, file_id: str) -> FileView:
    """Any file of this owner; another owner's file is as missing as one that never existed."""
    if file_id.startswith((OUTPUT_PREFIX, ERROR_PREFIX)):
        return _result_file(ctx, owner_id, file_id)
    with ctx.sessions() as session:
        row = session.get(File, file_id)
    if row is None or row.owner_id != owner_id or row.deleted_at is not None:
        raise JobNotFound(f"No such File object: {shown(file_id)}.")
    return _view(row)


def _result_file(ctx: AppContext, owner_id: str, file_id: str) -> FileView:
    is_output = file_id.startswith(OUTPUT_PREFIX)
    job_id = "batch_" + file_id.removeprefix(OUTPUT_PREFIX if is_output else ERROR_PREFIX)
    with ctx.sessions() as session:
        job = session.get(Job, job_id)
    if job is None or job.owner_id != owner_id or (job.output_key if is_output else job.error_key) is None:
        raise JobNotFound(f"No such File object: {shown(file_id)}.")
    key = job.kept_key(errors=not is_output)
    if key is None:
        raise JobNotFound(f"No such File object: {shown(file_id)} (it was deleted).")
    ended = job.completed_at or job.cancelled_at or job.expired_at or job.failed_at or job.created_at
    expires = ended + job.output_expires_after_s if job.output_expires_after_s else None
    if expires is not None and time.time() > expires:
        raise JobNotFound(f"No such File object: {shown(file_id)} (it has expired).")
    name = "output.jsonl" if is_output else "errors.jsonl"
    return FileView(file_id, f"{job_id}_{name}", "batch_output", ctx.storage.size(key), ended, key, expires)


def list_files(ctx: AppContext, owner_id: str, limit: int, after: str | None, order: str,
               purpose: str | None) -> list[FileView]:
    newest_first = order != "asc"
    query = select(File).where(File.owner_id == owner_id, File.deleted_at.is_(None))
    if purpose:
        query = query.where(File.purpose == purpose)
    with ctx.sessions() as session:
        if after:
            anchor = session.get(File, after)
            if anchor is None or anchor.owner_id != owner_id:
                return []
            before = (File.created_at < anchor.created_at) | ((File.created_at == anchor.created_at) & (File.id < anchor.id))
            later = (File.created_at > anchor.created_at) | ((File.created_at == anchor.created_at) & (File.id > anchor.id))
            query = query.where(before if newest_first else later)
        order_by = (File.created_at.desc(), File.id.desc()) if newest_first else (File.created_at, File.id)
        return [_view(r) for r in session.scalars(query.order_by(*order_by).limit(limit))]


def delete(ctx: AppContext, owner_id: str, file_id: str) -> None:
    """An upload, or an ended batch's output or error file (the batch keeps the file's id; reading it says it is
    gone; a merged download leaves it out)."""
    view = get(ctx, owner_id, file_id)
    if file_id.startswith((OUTPUT_PREFIX, ERROR_PREFIX)):
        is_output = file_id.startswith(OUTPUT_PREFIX)
        job_id = "batch_" + file_id.removeprefix(OUTPUT_PREFIX if is_output else ERROR_PREFIX)
        if forget_result_file(ctx, job_id, errors=not is_output):
            ctx.storage.delete(view.storage_key)
        return
    with transaction(ctx.sessions) as session:
        session.get(File, file_id).deleted_at = time.time()
    # a batch made from it keeps reading the stored input, so the bytes stay while any job refers to them
    with ctx.sessions() as session:
        in_use = session.scalar(select(Job.id).where(Job.input_key == view.storage_key).limit(1))
    if in_use is None:
        ctx.storage.delete(view.storage_key)
