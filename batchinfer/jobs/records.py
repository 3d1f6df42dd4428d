"""Records that cross a seam between stages: a request's typed identity, a prepared request (intake -> dispatch
-> units), a unit's result lines (units -> finalize) and a validation's report (intake -> state). record_store
reads and writes the files of them."""
from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import orjson

from batchinfer.engine.types import SamplingParams
from batchinfer.planner import PendingRequest
from batchinfer.planner.types import token_array

T = TypeVar("T")


def dumps(entry: dict[str, Any]) -> bytes:
    """A record as one compact JSON line. orjson: validation, dispatch and every unit write one record a request,
    mostly token ids, which json encodes many times slower; json itself for what orjson refuses (an int past 64
    bits in a seed or in echoed metadata)."""
    try:
        return orjson.dumps(entry, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # marked by a leading space (valid JSON): loads reads it back with json
        return b" " + json.dumps(entry, separators=(",", ":")).encode()


def loads(raw: str | bytes) -> Any:
    """json for what dumps wrote with json (orjson reads an int past 64 bits as a float), and for NaN or Infinity."""
    if raw[:1] in (" ", b" "):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def work_tokens(prompt: T, completion: T, cached: T) -> T:
    """Tokens a run computed: uncached prompt plus completion. Works on ints and on SQL column expressions."""
    return prompt - cached + completion  # type: ignore[operator]


@dataclass(frozen=True, order=True)
class RequestKey:
    """A request's identity: its job and its index among the job's valid lines; `part` is input k of an
    embeddings line, which the engine runs as one request per input."""

    job_id: str
    index: int
    part: int | None = None

    @property
    def engine_id(self) -> str:
        """The id the engine runs it under: made here, never parsed back (results are looked up by it)."""
        whole = f"{self.job_id}:{self.index}"
        return whole if self.part is None else f"{whole}#{self.part}"

    def whole(self) -> RequestKey:
        return RequestKey(self.job_id, self.index)


@dataclass(frozen=True)
class Origin:
    """Where a request came from in the tenant's file: the requests table keeps it, the output line repeats it."""

    line: int  # 1-based line of the input file
    custom_id: str


@dataclass
class PreparedRequest:
    """A valid input line, tokenized: what a job's prepared parts hold, one JSON line each. Where it came from
    (its line and custom_id) is the requests table's."""

    index: int  # position among the valid lines
    url: str
    model: str
    prompt_token_ids: list[int] | array  # an array('i') once compact()
    sampling: SamplingParams
    echo: dict[str, Any] | None = None  # request fields the output body repeats (a Response's metadata)

    def to_dict(self) -> dict[str, Any]:
        # shallow: asdict() would deep-copy every prompt token id, and validation and dispatch write every request
        entry = {name: getattr(self, name) for name in _PREPARED_FIELDS}
        if isinstance(self.prompt_token_ids, array):  # a compact record is written as the list it was read from
            entry["prompt_token_ids"] = self.prompt_token_ids.tolist()
        entry["sampling"] = {name: getattr(self.sampling, name) for name in _SAMPLING_FIELDS}  # flat: no deep copy
        return entry

    def to_json(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> PreparedRequest:
        entry = {name: entry[name] for name in _PREPARED_FIELDS if name in entry}  # older records held line, custom_id
        return cls(**{**entry, "sampling": SamplingParams(**entry["sampling"])})

    @classmethod
    def from_json(cls, text: str | bytes) -> PreparedRequest:
        return cls.from_dict(loads(text))

    def compact(self) -> PreparedRequest:
        """Keep the token ids as an array('i'): dispatch holds every pending record of a round (see token_array)."""
        self.prompt_token_ids = token_array(self.prompt_token_ids)
        return self

    def to_pending(self, job_id: str, priority: int = 0, submitted_at: float = 0.0, scope: str = "",
                   base: str = "") -> PendingRequest:
        """Shares the ids when compact (no copy); a list is copied into an array. base: the batch's model; a line
        naming another model names one of its adapters (validation let no other through)."""
        adapter = self.model if base and self.model != base else ""
        return PendingRequest(job_id, self.index, token_array(self.prompt_token_ids), self.sampling.max_tokens,
                              priority, submitted_at, scope, self.sampling.n, adapter)


_PREPARED_FIELDS = tuple(f.name for f in fields(PreparedRequest))
# SamplingParams' values are scalars, tuples and one dict of scalars: json writes them as asdict() would
_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


@dataclass
class UnitRequest:
    """One line of a unit's input file: a prepared request, the job it belongs to, and the engine's cache
    salt (the job's cache scope; None in a file written before scopes)."""

    job_id: str
    request: PreparedRequest
    cache_salt: str | None = None

    @property
    def key(self) -> RequestKey:
        return RequestKey(self.job_id, self.request.index)

    def to_json(self) -> bytes:
        return dumps({"job_id": self.job_id, "cache_salt": self.cache_salt, **self.request.to_dict()})

    @classmethod
    def from_json(cls, raw: str | bytes) -> UnitRequest:
        entry = loads(raw)
        job_id, cache_salt = entry.pop("job_id"), entry.pop("cache_salt", None)
        return cls(job_id, PreparedRequest.from_dict(entry), cache_salt)


@dataclass(frozen=True)
class UnitResult:
    """One request's outcome in a unit's results file, sorted by job, then index. A line is a header of numbers
    and then the output or error line itself, byte for byte as the job's file gets it: assembly copies it without
    parsing JSON (parsing and writing each record again took most of a 50,000-request finalize)."""

    job_id: str
    index: int  # position among the job's valid requests
    line: int  # 1-based line of the input file
    ok: bool
    record: dict[str, Any]  # the output or error line the job's files get
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of a thinking checkpoint's output; counted into the job at commit, not in the file

    @property
    def key(self) -> RequestKey:
        return RequestKey(self.job_id, self.index)

    @property
    def work_tokens(self) -> int:
        return work_tokens(self.prompt_tokens, self.completion_tokens, self.cached_tokens)

    def to_line(self) -> bytes:
        """`job index line ok prompt completion cached <output line>\n` (a job id has no space, JSON no newline)."""
        return b"%s %d %d %d %d %d %d " % (self.job_id.encode(), self.index, self.line, self.ok, self.prompt_tokens,
                                          self.completion_tokens, self.cached_tokens) + output_line_bytes(self.record)


@dataclass(frozen=True)
class ResultLine:
    """What assembly reads of a results line: where it goes, and the output or error line as it was written."""

    job_id: str
    index: int
    line: int
    ok: bool
    output: bytes  # ends with a newline

    @classmethod
    def parse(cls, raw: bytes) -> ResultLine:
        if raw[:1] == b"{":  # a JSON line: how earlier versions wrote results files (rendered now)
            entry = loads(raw)
            return cls(entry["job_id"], entry["index"], entry["line"], entry["ok"], output_line_bytes(entry["record"]))
        job_id, index, line, ok, _, _, _, output = raw.split(b" ", 7)
        return cls(job_id.decode(), int(index), int(line), ok == b"1", output)


def output_line_bytes(record: dict[str, Any]) -> bytes:
    """An output or error line of the job's files. json, not orjson: NaN and -Infinity logprobs are written as
    such, and the files stay byte for byte what they were."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@dataclass
class Counts:
    """A job's request counters: what its units' commits add to the job, what a running unit reports live (the
    columns of jobs and unit_progress bear these names)."""

    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, ok: bool, prompt_tokens: int = 0, completion_tokens: int = 0, cached_tokens: int = 0) -> None:
        self.completed += ok
        self.failed += not ok
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cached_tokens += cached_tokens


COUNTERS = tuple(f.name for f in fields(Counts))


@dataclass
class LineError:
    """A problem validation found: its line (None: the whole file), its code, and the field. per_request: a body the
    endpoint refuses, that request's own 400 while the rest runs (else a problem of the file or of a line's envelope,
    which fails the batch)."""

    line: int | None
    code: str
    message: str
    param: str | None = None
    custom_id: str | None = None
    per_request: bool = False

    def to_dict(self) -> dict:
        return {"line": self.line, "code": self.code, "param": self.param, "message": self.message}

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "file"
        return f"{where}: {self.code}: {self.message}"


@dataclass
class ValidationReport:
    """What a validation run found, as the move that queues or fails the job takes it (state.intake)."""

    lines: int = 0  # non-blank lines seen
    valid: int = 0
    error_count: int = 0  # problems that fail the batch (of the file and of lines' envelopes)
    errors: list[LineError] = field(default_factory=list)  # the first max_errors_kept
    refused: int = 0  # lines whose body the endpoint refuses: each fails alone, the rest run
    request_errors: list[LineError] = field(default_factory=list)  # their problems, the first max_errors_kept
    file_error: bool = False  # a whole-file problem (empty, too large, too many requests, no model served)
    model: str = ""  # the batch's model, as validation settled it

    @property
    def ok(self) -> bool:
        return self.error_count == 0
