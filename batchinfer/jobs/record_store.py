"""The record store: every file the job system keeps for itself, where it lives, and the one way each is
written and read.

    jobs/<job>/input.jsonl                 the tenant's file as submitted (an upload keeps its own key)
    jobs/<job>/prepared-parts/<k>.jsonl    its valid requests, tokenized: indexes PART_LINES*k .. PART_LINES*(k+1)-1
    jobs/<job>/invalid.jsonl               the error lines of its bad input lines
    units/<unit>/input.jsonl               a unit's requests (dispatch writes, the unit runner reads)
    units/<unit>/results-<attempt>.jsonl   one run's results (the unit runner writes, finalize reads)
    jobs/<job>/output.jsonl, errors.jsonl  the job's files (finalize writes)

A part is stored before the request rows it holds are committed, so whatever a dispatch finds pending is
readable, also while the rest of the file is still validated.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from batchinfer.jobs.records import PreparedRequest, RequestKey, UnitRequest, UnitResult, loads
from batchinfer.storage import Storage

PART_LINES = 1000


def job_input(job_id: str) -> str:
    return f"jobs/{job_id}/input.jsonl"


def job_invalid(job_id: str) -> str:
    return f"jobs/{job_id}/invalid.jsonl"


def job_output(job_id: str) -> str:
    return f"jobs/{job_id}/output.jsonl"


def job_errors(job_id: str) -> str:
    return f"jobs/{job_id}/errors.jsonl"


def unit_input(unit_id: str) -> str:
    return f"units/{unit_id}/input.jsonl"


def unit_results(unit_id: str, attempt: int, chunk: int | None = None) -> str:
    """A run's results file, or (chunk) one of the files it committed while it ran."""
    if chunk is not None:
        return f"units/{unit_id}/results-{attempt}-chunk-{chunk:05d}.jsonl"
    return f"units/{unit_id}/results-{attempt}.jsonl"


def _part(job_id: str, part: int) -> str:
    return f"jobs/{job_id}/prepared-parts/{part:06d}.jsonl"


def _whole_prepared(job_id: str) -> str:
    """Where earlier versions kept a job's prepared requests in one file: still read for jobs they validated."""
    return f"jobs/{job_id}/prepared.jsonl"


# ---- prepared requests --------------------------------------------------------------------------------

def part_of(index: int) -> int:
    return index // PART_LINES


def store_part(storage: Storage, job_id: str, part: int, lines: Iterable[bytes]) -> None:
    """One part's prepared lines (PreparedRequest.to_json() + newline each), in index order."""
    with storage.open_write(_part(job_id, part)) as out:
        out.write(b"".join(lines))


def read_prepared(storage: Storage, job_id: str, indexes: set[int] | None = None) -> dict[int, PreparedRequest]:
    """The prepared requests of `indexes` (None: all of them), compact (array ids: dispatch holds a whole
    round's). Request `index` is line `index % PART_LINES` of its part, so only the lines wanted are parsed.
    Raises FileNotFoundError when the job has none stored."""
    found: dict[int, PreparedRequest] = {}
    for k in sorted({part_of(i) for i in indexes}) if indexes is not None else itertools.count():
        try:
            with storage.open_read(_part(job_id, k)) as stream:
                lines = list(stream)
        except FileNotFoundError:
            if indexes is None and k > 0:
                return found  # past the last part
            return _read_whole(storage, job_id, indexes, found)
        found.update(_pick(lines, k * PART_LINES, indexes))
    return found


def _pick(lines: list[bytes], first: int, indexes: set[int] | None) -> dict[int, PreparedRequest]:
    wanted = range(first, first + len(lines)) if indexes is None else indexes
    picked = {i: PreparedRequest.from_json(lines[i - first]).compact() for i in wanted if 0 <= i - first < len(lines)}
    if all(req.index == i for i, req in picked.items()):
        return picked
    # not in index order (written by hand, say): every line parsed
    return {req.index: req for req in (PreparedRequest.from_json(raw).compact() for raw in lines)
            if indexes is None or req.index in indexes}


def _read_whole(storage: Storage, job_id: str, indexes: set[int] | None,
                found: dict[int, PreparedRequest]) -> dict[int, PreparedRequest]:
    """A job an earlier version validated (one prepared file): read whole, once."""
    with storage.open_read(_whole_prepared(job_id)) as stream:
        for raw in stream:
            req = PreparedRequest.from_json(raw)
            if indexes is None or req.index in indexes:
                found[req.index] = req.compact()
    return found


def delete_job_files(storage: Storage, job_id: str, total: int, *keys: str | None) -> None:
    """A job's own files (its parts, invalid lines and `keys`, the job's input, output and errors); a shared
    upload is never deleted with it. Deleting a file never stored is a no-op."""
    parts = [_part(job_id, k) for k in range(-(-total // PART_LINES))]
    for key in {*keys, job_invalid(job_id), _whole_prepared(job_id), *parts}:
        if key and key.startswith(f"jobs/{job_id}/"):
            storage.delete(key)


# ---- unit inputs ----------------------------------------------------------------------------------------

def store_unit_input(storage: Storage, unit_id: str, requests: list[UnitRequest]) -> None:
    """Stored, then kept in memory too: when this process runs the unit, it reads no file (UnitInputs)."""
    with storage.open_write(unit_input(unit_id)) as out:
        for entry in requests:
            out.write(entry.to_json() + b"\n")
    kept_inputs(storage).put(unit_id, requests)


def read_unit_input(storage: Storage, unit_id: str, wanted: Iterable[RequestKey]) -> list[UnitRequest]:
    """The unit's requests among `wanted`, in the unit's order: from memory when this process dispatched it."""
    wanted = set(wanted)
    kept = kept_inputs(storage).take(unit_id)
    if kept is not None:
        return [entry for entry in kept if entry.key in wanted]
    with storage.open_read(unit_input(unit_id)) as stream:
        return [entry for entry in map(UnitRequest.from_json, stream) if entry.key in wanted]


MAX_KEPT_TOKENS = 4_000_000  # prompt tokens held at most: ~16 MB of token ids (arrays), 50,000 short chat requests
MAX_KEPT_AGE_S = 300.0  # an entry whose unit ran elsewhere (another worker took it) is dropped this long after


class UnitInputs:
    """Unit inputs this process stored, kept for the units it then runs itself (one worker dispatches and runs;
    so does `batchinfer run`). The stored input stays the truth: a unit this process did not dispatch, a rerun,
    or one past the bounds reads storage. Each entry is taken once, and dropped when its unit never runs here."""

    def __init__(self, max_tokens: int = MAX_KEPT_TOKENS, max_age_s: float = MAX_KEPT_AGE_S):
        self.max_tokens, self.max_age_s = max_tokens, max_age_s
        self._entries: dict[str, tuple[float, int, list[UnitRequest]]] = {}  # insertion order: oldest first
        self._tokens = 0
        self._lock = threading.Lock()

    def put(self, unit_id: str, requests: list[UnitRequest]) -> bool:
        """Keep a unit's input once stored; False (not kept) past the bound: its unit reads storage."""
        tokens = sum(len(r.request.prompt_token_ids) for r in requests)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if self._tokens + tokens > self.max_tokens:
                return False
            self._entries[unit_id] = (now, tokens, requests)
            self._tokens += tokens
            return True

    def take(self, unit_id: str) -> list[UnitRequest] | None:
        with self._lock:
            entry = self._entries.pop(unit_id, None)
            if entry is None:
                return None
            self._tokens -= entry[1]
            return entry[2]

    def _expire(self, now: float) -> None:
        for unit_id, (kept_at, tokens, _) in list(self._entries.items()):
            if now - kept_at < self.max_age_s:
                break
            del self._entries[unit_id]
            self._tokens -= tokens


_kept: weakref.WeakKeyDictionary[Storage, UnitInputs] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def kept_inputs(storage: Storage) -> UnitInputs:
    """The inputs stored through this storage object (one per context): a context on another store never sees them."""
    with _kept_lock:
        found = _kept.get(storage)
        if found is None:
            found = _kept[storage] = UnitInputs()
        return found


# ---- unit results ---------------------------------------------------------------------------------------

def store_results(storage: Storage, unit_id: str, attempt: int, records: dict[RequestKey, UnitResult],
                  chunk: int | None = None) -> str:
    """One run's results (or a chunk of them), by job then index (finalize merges files in that order); returns
    their key."""
    key = unit_results(unit_id, attempt, chunk)
    with storage.open_write(key) as out:
        for request in sorted(records):
            out.write(records[request].to_line())
    return key


def invalid_lines(storage: Storage, job_id: str) -> Iterator[tuple[int, bytes]]:
    """(input line, error line) of each bad input line of the job, in line order; none when nothing was refused."""
    if not storage.exists(job_invalid(job_id)):
        return
    with storage.open_read(job_invalid(job_id)) as stream:
        for raw in stream:
            yield loads(raw)["error"]["line"], raw
