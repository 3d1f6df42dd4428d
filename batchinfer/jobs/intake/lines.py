"""Streaming validation of an OpenAI Batch input file.

Every line is checked (nothing runs before the whole file has been read); each problem is reported with
its line number, a code and the field. Valid lines are tokenized here with the model's chat template, so
the token ids travel with the job and workers never re-tokenize.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterable, TypeVar, cast

from pydantic import BaseModel, ValidationError

from batchinfer.errors import excerpt, shown
from batchinfer.jobs.endpoints.batch_line import InputLine
from batchinfer.jobs.endpoints.embeddings import EMBEDDINGS_URL, EmbeddingsBody
from batchinfer.jobs.endpoints.kinds import BODIES, Body
from batchinfer.jobs.endpoints.responses import ResponsesBody
from batchinfer.jobs.endpoints.sampling import Sampling
from batchinfer.jobs.intake.line_problems import Problem, first, one_per_param, problems
from batchinfer.jobs.records import LineError, PreparedRequest, ValidationReport
from batchinfer.settings import Settings

M = TypeVar("M", bound=BaseModel)

CODES = ("invalid_json_line", "invalid_utf8", "not_an_object", "missing_field", "invalid_field",
         "duplicate_custom_id", "unsupported_url", "model_not_found", "empty_file", "too_many_requests",
         "line_too_long", "file_too_large", "context_length_exceeded", "mismatched_model")


@dataclass
class ValidLine:
    """A valid input line as validation hands it on: where it came from (the requests table keeps that) and
    the prepared request (the prepared parts keep that)."""

    line: int
    custom_id: str
    request: PreparedRequest


def _setting(name: str):
    """A setting's default: each limit has its home in Settings."""
    return field(default=Settings.model_fields[name].default)


@dataclass
class ValidationLimits:
    model_id: str  # the batch's model: every line names it (OpenAI's rule) or none
    max_model_len: int
    max_requests: int = _setting("max_requests_per_file")
    max_line_bytes: int = _setting("max_line_bytes")
    max_file_bytes: int = _setting("max_file_bytes")
    default_max_tokens: int = _setting("default_max_tokens")
    max_errors_kept: int = _setting("max_errors_kept")
    endpoint: str | None = None  # the batch's (None: a file submitted without one)
    served_models: tuple[str, ...] = ()  # every model the fleet serves, for the errors of lines naming another
    sampling_defaults: dict = field(default_factory=dict)  # the checkpoint's generation_config.json defaults


def _read_lines(stream: BinaryIO, limits: ValidationLimits, report: ValidationReport, on_error):
    """Yield (line_number, bytes) for non-blank lines, enforcing the per-line and per-file byte limits."""
    number = total = 0
    while True:
        raw = stream.readline(limits.max_line_bytes + 1)
        if not raw:
            return
        number += 1
        too_long = len(raw) > limits.max_line_bytes and not raw.endswith(b"\n")
        total += len(raw)
        while too_long:
            rest = stream.readline(1024 * 1024)
            total += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        if total > limits.max_file_bytes:
            report.file_error = True
            on_error(LineError(number, "file_too_large", f"the file is over {limits.max_file_bytes} bytes"))
            return
        if too_long:
            report.lines += 1
            on_error(LineError(number, "line_too_long", f"the line is over {limits.max_line_bytes} bytes"))
            continue
        if raw.strip():
            yield number, raw


CHUNK_LINES = 256  # lines parsed, then tokenized in one batch call, then reported in line order


def validate_stream(stream: BinaryIO, tokenizer, limits: ValidationLimits,
                    on_valid: Callable[[ValidLine], None],
                    on_invalid: Callable[[LineError], None] | None = None) -> ValidationReport:
    report = ValidationReport()
    seen_ids: set[str] = set()
    chunk: list[tuple[int, bytes]] = []

    def record(error: LineError) -> None:
        report.error_count += 1
        if len(report.errors) < limits.max_errors_kept:
            report.errors.append(error)
        if on_invalid and error.line is not None and not report.file_error:
            on_invalid(error)

    def flush() -> None:
        """The chunk's lines, reported in line order (the error file stays sorted by line)."""
        for found, prepared in _check_chunk(chunk, report.valid, tokenizer, limits, seen_ids):
            if prepared is None:
                record(found[0])
                for problem in found[1:]:
                    _count_extra(report, problem, limits)
            else:
                report.valid += 1
                on_valid(prepared)
        chunk.clear()

    def reader_error(error: LineError) -> None:  # a later line's problem: the lines before it go first
        flush()
        record(error)

    for number, raw in _read_lines(stream, limits, report, reader_error):
        report.lines += 1
        if report.lines > limits.max_requests:
            flush()
            report.file_error = True
            record(LineError(number, "too_many_requests", f"the file has more than {limits.max_requests} requests"))
            break
        chunk.append((number, raw))
        if len(chunk) >= CHUNK_LINES:
            flush()
    flush()
    if report.lines == 0 and not report.file_error:
        report.file_error = True
        record(LineError(None, "empty_file", "the file has no requests"))
    return report


def not_served(model, served: Iterable[str]) -> str:
    """The one line a batch (or a line) naming a model nobody serves fails with: the served ones listed."""
    names = ", ".join(repr(m) for m in served) or "none"
    return f"model {shown(model)} is not served here (served: {names})"


def unserved_model_report(model, served: Iterable[str]) -> ValidationReport:
    """A batch whose model nobody serves fails whole (skip_invalid or not): no line of it could run."""
    error = LineError(None, "model_not_found", not_served(model, served), "body.model")
    return ValidationReport(error_count=1, errors=[error], file_error=True)


def _other_model(model, limits: ValidationLimits, custom_id) -> tuple[str, str, str, str | None]:
    if model in limits.served_models:
        return ("mismatched_model", f"every line of a batch names the same model: this one names {shown(model)}, "
                f"the batch {limits.model_id!r}", "body.model", custom_id)
    return "model_not_found", not_served(model, limits.served_models or [limits.model_id]), "body.model", custom_id


def first_named_model(stream: BinaryIO, max_line_bytes: int) -> str | None:
    """The model the first non-blank line names (None: it names none, or it is no request line at all)."""
    return peek_model(stream, max_line_bytes)[0]


def peek_model(stream: BinaryIO, max_line_bytes: int) -> tuple[str | None, BinaryIO]:
    """first_named_model, and a stream that reads from the start again (what was read is replayed)."""
    head: list[bytes] = []
    while raw := stream.readline(max_line_bytes + 1):
        head.append(raw)
        if raw.strip():
            return _named_model(raw), cast(BinaryIO, _Replay(head, stream))
    return None, cast(BinaryIO, _Replay(head, stream))


def _named_model(raw: bytes) -> str | None:
    try:
        body = json.loads(raw).get("body")
        model = body.get("model") if isinstance(body, dict) else None
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) and model else None


class _Replay:
    """A stream's lines already read, then the rest of it: validation reads it by readline(size) only."""

    def __init__(self, head: list[bytes], rest: BinaryIO):
        self.head, self.rest = head, rest

    def readline(self, size: int = -1) -> bytes:
        return self.head.pop(0) if self.head else self.rest.readline(size)


def _count_extra(report: ValidationReport, error: LineError, limits: ValidationLimits) -> None:
    """A second problem on the same line is reported but produces no extra error-file line."""
    report.error_count += 1
    if len(report.errors) < limits.max_errors_kept:
        report.errors.append(error)


class _Rejected(Exception):
    """A line's problems as (code, message, param, custom_id): the first one goes to the error file."""

    def __init__(self, *problems: tuple[str, str, str | None, str | None]):
        super().__init__(problems[0][1])
        self.problems = problems


@dataclass
class _Parsed:
    """A line that passed every check before tokenization; its prompt text waits for the chunk's batch encode."""

    number: int
    custom_id: str
    url: str
    model: str
    body: Body
    text: str


def _check_chunk(chunk: list[tuple[int, bytes]], first_index: int, tokenizer, limits: ValidationLimits,
                 seen_ids: set[str]) -> list[tuple[list[LineError], ValidLine | None]]:
    """(problems, prepared) per line, in order; indexes count the valid lines from first_index. The checks run
    as they did one line at a time: parse and check the envelope and body, render the prompt, then (after the
    chunk's one encode call) the checks on token counts and ids."""
    parsed: list[_Parsed | ValidLine | list[LineError]] = []
    for number, raw in chunk:  # in line order: the first line with a custom_id keeps it
        try:
            parsed.append(_parse_line(number, raw, tokenizer, limits, seen_ids))
        except _Rejected as rejected:
            parsed.append([LineError(number, *problem) for problem in rejected.problems])
    texts = [p.text for p in parsed if isinstance(p, _Parsed)]
    encoded = iter(_encode_batch(tokenizer, texts))
    results: list[tuple[list[LineError], ValidLine | None]] = []
    index = first_index
    for p in parsed:
        if isinstance(p, list):
            results.append((p, None))
            continue
        if isinstance(p, ValidLine):  # an embeddings line, done at parsing
            prepared = p
        else:
            try:
                prepared = _prepare(p, next(encoded), index, tokenizer, limits)
            except _Rejected as rejected:
                results.append(([LineError(p.number, *problem) for problem in rejected.problems], None))
                continue
        prepared.request.index = index
        index += 1
        results.append(([], prepared))
    return results


def _encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """One call for the chunk where the tokenizer has it (the fast tokenizer encodes a batch in Rust)."""
    if not texts:
        return []
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return encode_batch(texts, add_special_tokens=False)
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]


def _parse_line(number, raw, tokenizer, limits: ValidationLimits, seen_ids: set[str]) -> _Parsed | ValidLine:
    """Every check but those that need the token ids; an embeddings line is done here (index set by the caller)."""
    line, custom_id = _envelope(_decode(raw), seen_ids)
    model = line.body.get("model", limits.model_id)
    if model != limits.model_id:
        raise _Rejected(_other_model(model, limits, custom_id))
    _check_endpoint(line.url, limits.endpoint, custom_id)
    body = _body(line, custom_id)
    if isinstance(body, EmbeddingsBody):
        return _prepare_embedding(0, number, custom_id, line.url, model, body, tokenizer, limits)
    return _Parsed(number, custom_id, line.url, model, body, body.prompt_text(tokenizer))


def _prepare(p: _Parsed, prompt_ids: list[int], index: int, tokenizer, limits: ValidationLimits) -> ValidLine:
    body, custom_id = p.body, p.custom_id
    sampling = body.params(limits.default_max_tokens, limits.sampling_defaults)
    needed = len(prompt_ids) + sampling.max_tokens
    if needed > limits.max_model_len:
        raise _Rejected(("context_length_exceeded",
                         f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) = {needed} "
                         f"is over the model's context of {limits.max_model_len} tokens", "body.max_tokens", custom_id))
    echo = body.echo() if isinstance(body, ResponsesBody) else None
    _check_token_ids(sampling, len(tokenizer), custom_id)
    if not isinstance(body, EmbeddingsBody):  # embeddings lines are prepared apart and take no constraint
        _check_constraint(body, custom_id)
    return ValidLine(p.number, custom_id, PreparedRequest(index, p.url, p.model, prompt_ids, sampling, echo))


def _check_endpoint(url: str, endpoint: str | None, custom_id: str) -> None:
    """An embeddings batch holds only embedding lines, and embedding lines only go in one (as OpenAI requires)."""
    if endpoint is not None and (url == EMBEDDINGS_URL) != (endpoint == EMBEDDINGS_URL):
        raise _Rejected(("unsupported_url", f"a line for {url} cannot be in a batch whose endpoint is {endpoint}",
                         "url", custom_id))


def _prepare_embedding(index, number, custom_id, url, model, body: EmbeddingsBody, tokenizer,
                       limits: ValidationLimits) -> ValidLine:
    inputs = body.token_inputs(tokenizer)
    vocab = len(tokenizer)
    for k, ids in enumerate(inputs):
        if not ids:
            raise _Rejected(("invalid_field", f"body.input: input {k} has no tokens", "body.input", custom_id))
        if max(ids) >= vocab:
            raise _Rejected(("invalid_field", f"body.input: input {k} holds token id {max(ids)}, not in the "
                             f"vocabulary of {vocab}", "body.input", custom_id))
        if len(ids) >= limits.max_model_len:
            raise _Rejected(("context_length_exceeded", f"input {k} ({len(ids)} tokens) is over the model's "
                             f"context of {limits.max_model_len} tokens", "body.input", custom_id))
    return ValidLine(number, custom_id, PreparedRequest(index, url, model, inputs[0],
                                                        body.params(limits.default_max_tokens), body.echo(inputs)))


def _check_constraint(body: Sampling | ResponsesBody, custom_id: str) -> None:
    """At most one output constraint, and one the grammar library can compile (found here, at submit time)."""
    given = body.constraints_given()
    if len(given) > 1:
        raise _Rejected(("invalid_field", f"body.{given[1]} cannot be combined with body.{given[0]}",
                         f"body.{given[1]}", custom_id))
    constraint = body.constraint()
    if constraint is None:
        return
    from batchinfer.engine.sampling.grammar import check_constraint  # the grammar library loads only for lines that need it

    reason = check_constraint(*constraint)
    if reason is not None:
        param = f"body.{given[0]}"
        raise _Rejected(("invalid_field", f"{param} cannot be compiled into a grammar: {excerpt(reason)}", param, custom_id))


def _check_token_ids(sampling, vocab_size: int, custom_id: str) -> None:
    """Token ids the line names must be in the vocabulary; min_tokens must leave room under max_tokens."""
    for param, ids in (("body.logit_bias", sampling.logit_bias), ("body.stop_token_ids", sampling.stop_token_ids)):
        outside = [t for t in ids if t >= vocab_size]
        if outside:
            raise _Rejected(("invalid_field", f"{param} names token {outside[0]}, outside the vocabulary "
                             f"(ids 0 to {vocab_size - 1})", param, custom_id))
    if sampling.min_tokens > sampling.max_tokens:
        raise _Rejected(("invalid_field", f"body.min_tokens ({sampling.min_tokens}) is over max_tokens "
                         f"({sampling.max_tokens})", "body.min_tokens", custom_id))


def _decode(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except UnicodeDecodeError as exc:
        raise _Rejected(("invalid_utf8", f"the line is not valid UTF-8 (byte {exc.start})", None, None)) from None
    except (ValueError, RecursionError) as exc:  # ValueError also covers an integer of over 4300 digits
        reason = _json_position(exc, text) if isinstance(exc, json.JSONDecodeError) else _json_limit(exc)
        raise _Rejected(("invalid_json_line", f"the line is not valid JSON: {reason}", None, None)) from None
    if not isinstance(obj, dict):
        raise _Rejected(("not_an_object", f"the line is a JSON {type(obj).__name__}, not an object", None, None))
    return obj


def _json_position(exc: json.JSONDecodeError, text: str) -> str:
    """The character (1-based, in the line) where parsing failed; a line cut short says so (its column
    would be the 1 after the trailing newline)."""
    if exc.pos >= len(text.rstrip()):
        return f"{exc.msg} at character {len(text.rstrip()) + 1}: the line ends early (is the object cut short?)"
    return f"{exc.msg} at character {exc.pos + 1}"


def _json_limit(exc: Exception) -> str:
    return "it is nested too deeply" if isinstance(exc, RecursionError) else excerpt(str(exc).split(";")[0])


def _envelope(obj: dict, seen_ids: set[str]) -> tuple[InputLine, str]:
    """In the order the checks always ran: missing fields, custom_id, its uniqueness, then method, url, body."""
    line, found = _parse(InputLine, obj)
    problem = first(found) if found else None
    custom_id = obj.get("custom_id") if not any(p.path[:1] == ("custom_id",) for p in found) else None
    if problem and (problem.code == "missing_field" or problem.path == ("custom_id",)):
        raise _Rejected((problem.code, problem.message, problem.param, custom_id))
    if custom_id in seen_ids:
        raise _Rejected(("duplicate_custom_id", f"custom_id {shown(custom_id)} appears more than once", "custom_id",
                         custom_id))
    seen_ids.add(custom_id)
    if problem:
        raise _Rejected((problem.code, problem.message, problem.param, custom_id))
    return line, custom_id


def _body(line: InputLine, custom_id: str) -> Body:
    """The first problem of the prompt (messages or prompt) and one for each bad sampling field."""
    model = BODIES[line.url]
    body, found = _parse(model, line.body, "body")
    if found:
        prompt = [p for p in found if p.path[:1] == (model.PROMPT_FIELD,)]
        rest = [p for p in found if p.path[:1] != (model.PROMPT_FIELD,)]
        reported = ([first(prompt)] if prompt else []) + one_per_param(rest)
        raise _Rejected(*[(p.code, p.message, p.param, custom_id) for p in reported])
    return body


def _parse(model: type[M], data: dict, prefix: str = "") -> tuple[M | None, list[Problem]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, problems(exc, data, prefix, model)
