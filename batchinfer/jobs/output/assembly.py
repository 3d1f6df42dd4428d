"""Build a job's output and error files from its units' results: a streaming k-way merge in input order."""
from __future__ import annotations

import heapq
import json
from typing import Iterator

from sqlalchemy import select

from batchinfer.jobs.output import formats
from batchinfer.jobs import storage_keys
from batchinfer.db.models import Request, RequestStatus, WorkUnit
from batchinfer.jobs.output.records import UnitResult
from batchinfer.storage import Storage

_UNFINISHED_CODES = {RequestStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request finished"),
                     RequestStatus.EXPIRED: ("batch_expired", "the batch's completion window passed before this request finished")}


def _unit_records(storage: Storage, result_key: str, job_id: str, committed: set[int]) -> Iterator[tuple[int, bool, bytes]]:
    """(line, ok, output line) of one job in one unit's result file (sorted by job, then index). Only the
    requests this unit committed: a request cancelled while the unit ran is in the file but not counted."""
    with storage.open_read(result_key) as stream:
        for raw in stream:
            entry = UnitResult.from_json(raw)
            if entry.job_id == job_id and entry.index in committed:
                yield entry.line, entry.ok, formats.dumps(entry.record)


def _invalid_records(storage: Storage, job_id: str) -> Iterator[tuple[int, bool, bytes]]:
    if not storage.exists(storage_keys.job_invalid(job_id)):
        return
    with storage.open_read(storage_keys.job_invalid(job_id)) as stream:
        for raw in stream:
            yield json.loads(raw)["error"]["line"], False, raw


def _unfinished_records(session, job_id: str) -> Iterator[tuple[int, bool, bytes]]:
    rows = session.execute(select(Request.index, Request.line, Request.custom_id, Request.status)
                           .where(Request.job_id == job_id, Request.status.in_(tuple(_UNFINISHED_CODES)))
                           .order_by(Request.index))
    for index, line, custom_id, status in rows:
        code, message = _UNFINISHED_CODES[status]
        yield line, False, formats.dumps(formats.error_line(job_id, index, custom_id, code, message, line))


def _result_keys(session, job_id: str) -> dict[str, set[int]]:
    """Each committed unit's results file, with the indices of this job's requests it finished."""
    query = (select(WorkUnit.result_key, Request.index).join(Request, Request.unit_id == WorkUnit.id)
             .where(Request.job_id == job_id, Request.status.in_((RequestStatus.COMPLETED, RequestStatus.FAILED)),
                    WorkUnit.result_key.is_not(None)))
    found: dict[str, set[int]] = {}
    for key, index in session.execute(query):
        found.setdefault(key, set()).add(index)
    return found


def assemble(session, storage: Storage, job_id: str) -> tuple[str, str | None]:
    """Write output.jsonl (always) and errors.jsonl (when any request failed); return their keys."""
    result_keys = _result_keys(session, job_id)

    def merged():
        sources = [_unit_records(storage, key, job_id, result_keys[key]) for key in sorted(result_keys)]
        return heapq.merge(*sources, key=lambda r: r[0])

    with storage.open_write(storage_keys.job_output(job_id)) as out:
        for _, ok, raw in merged():
            if ok:
                out.write(raw)
    failed = (r for r in merged() if not r[1])
    errors = heapq.merge(failed, _invalid_records(storage, job_id), _unfinished_records(session, job_id),
                         key=lambda r: r[0])
    first = next(errors, None)
    if first is None:
        return storage_keys.job_output(job_id), None
    with storage.open_write(storage_keys.job_errors(job_id)) as out:
        out.write(first[2])
        for _, _, raw in errors:
            out.write(raw)
    return storage_keys.job_output(job_id), storage_keys.job_errors(job_id)
