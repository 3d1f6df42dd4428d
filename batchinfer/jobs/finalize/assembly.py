"""Build a job's output and error files from its units' results: a streaming k-way merge in input order.

The units' result files are copied first, several at once, to local files, as they are (no line parsed: a results
line carries its output line ready, records.UnitResult), so the merge reads local disk, each file once, keeping
only this job's committed lines; output and errors come out of one pass.
"""
from __future__ import annotations

import heapq
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Iterator

from sqlalchemy import select

from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs import record_store
from batchinfer.db.models import Request, RequestStatus, UnitChunk, WorkUnit
from batchinfer.jobs.records import ResultLine
from batchinfer.storage import Storage

_UNFINISHED_CODES = {RequestStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request finished"),
                     RequestStatus.EXPIRED: ("batch_expired", "the batch's completion window passed before this request finished")}
FETCHERS = 8  # result files fetched at once: each is mostly a round trip
MAX_OPEN = 256  # local files merged at once; more are merged in rounds (open files stay bounded)
COPY_BYTES = 1 << 20
Record = tuple[int, bool, bytes]  # (input line, ok, output or error line)


def _fetch(storage: Storage, result_key: str, target: Path) -> Path:
    with storage.open_read(result_key) as stream, open(target, "wb") as out:
        shutil.copyfileobj(stream, out, COPY_BYTES)
    return target


def _job_lines(path: Path, job_id: str, uncounted: frozenset[int]) -> Iterator[tuple[int, bool, bytes, bytes]]:
    """(input line, ok, output line, raw results line) of this job's lines of a local results file (sorted by job, then index),
    except the requests the unit did not commit (a request cancelled while the unit ran is in the file but not
    counted). A unit may hold several jobs' requests."""
    with open(path, "rb") as stream:
        for raw in stream:
            entry = ResultLine.parse(raw)
            if entry.job_id == job_id and entry.index not in uncounted:
                yield entry.line, entry.ok, entry.output, raw


def _merged_down(paths: list[Path], folder: Path, job_id: str, uncounted: frozenset[int]) -> list[Iterator]:
    """At most MAX_OPEN files open at once: groups merged into one file each (this job's lines, raw), in rounds."""
    sources = [_job_lines(path, job_id, uncounted) for path in paths]
    while len(sources) > MAX_OPEN:
        merged = []
        for start in range(0, len(sources), MAX_OPEN):
            target = folder / f"merged-{len(sources)}-{start}"
            with open(target, "wb") as out:
                out.writelines(r[3] for r in heapq.merge(*sources[start:start + MAX_OPEN], key=lambda r: r[0]))
            merged.append(_job_lines(target, job_id, uncounted))
        sources = merged
    return sources


def _result_records(sources: list[Iterator]) -> Iterator[Record]:
    """One line a request: a run that lost the fence to another run's chunk may hold the same request's line."""
    last = None
    for line, ok, output, _ in heapq.merge(*sources, key=lambda r: r[0]):
        if line != last:
            yield line, ok, output
        last = line


def _invalid_records(storage: Storage, job_id: str) -> Iterator[Record]:
    for line, raw in record_store.invalid_lines(storage, job_id):
        yield line, False, raw


def _unfinished_records(session, job_id: str) -> Iterator[Record]:
    rows = session.execute(select(Request.index, Request.line, Request.custom_id, Request.status)
                           .where(Request.job_id == job_id, Request.status.in_(tuple(_UNFINISHED_CODES)))
                           .order_by(Request.index))
    for index, line, custom_id, status in rows:
        code, message = _UNFINISHED_CODES[status]
        yield line, False, formats.dumps(formats.error_line(job_id, index, custom_id, code, message, line))


def _result_keys(session, job_id: str) -> list[str]:
    """The results file of each committed unit that holds requests of this job, and of each chunk such a unit's
    runs committed while they ran."""
    units = sorted(session.scalars(select(WorkUnit.result_key).join(Request, Request.unit_id == WorkUnit.id)
                                   .where(Request.job_id == job_id, WorkUnit.result_key.is_not(None)).distinct()))
    held = select(Request.unit_id).where(Request.job_id == job_id, Request.unit_id.is_not(None)).distinct()
    chunks = sorted(session.scalars(select(UnitChunk.result_key).where(UnitChunk.unit_id.in_(held))))
    return units + chunks


def _uncounted(session, job_id: str) -> frozenset[int]:
    """Requests of this job in a unit that its commit did not count (closed meanwhile): few, usually none."""
    return frozenset(session.scalars(select(Request.index).where(
        Request.job_id == job_id, Request.unit_id.is_not(None),
        Request.status.not_in((RequestStatus.COMPLETED, RequestStatus.FAILED)))))


def assemble(session, storage: Storage, job_id: str) -> tuple[str, str | None]:
    """Write output.jsonl (always) and errors.jsonl (when any request failed); return their keys."""
    keys, uncounted = _result_keys(session, job_id), _uncounted(session, job_id)
    output_key, error_key = record_store.job_output(job_id), record_store.job_errors(job_id)
    with tempfile.TemporaryDirectory(prefix="assemble-") as local:
        folder = Path(local)
        with ThreadPoolExecutor(FETCHERS, thread_name_prefix="assemble") as fetchers:
            paths = list(fetchers.map(lambda n_key: _fetch(storage, n_key[1], folder / f"unit-{n_key[0]}"),
                                      enumerate(keys)))
        sources = [_result_records(_merged_down(paths, folder, job_id, uncounted)), _invalid_records(storage, job_id),
                   _unfinished_records(session, job_id)]
        with storage.open_write(output_key) as out, ExitStack() as lazy:
            errors = None
            for _, ok, raw in heapq.merge(*sources, key=lambda r: r[0]):
                if ok:
                    out.write(raw)
                    continue
                if errors is None:
                    errors = lazy.enter_context(storage.open_write(error_key))
                errors.write(raw)
    return output_key, error_key if errors is not None else None
