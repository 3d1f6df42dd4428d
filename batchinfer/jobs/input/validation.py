"""Streaming validation of an OpenAI Batch input file.

Every line is checked (nothing runs before the whole file has been read); each problem is reported with
its line number, a code and the field. Valid lines are tokenized here with the model's chat template, so
the token ids travel with the job and workers never re-tokenize.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from batchinfer.errors import excerpt, shown
from batchinfer.jobs.input.bodies import BODIES, Body
from batchinfer.jobs.input.input_line import InputLine, Sampling
from batchinfer.jobs.input.embeddings_line import EMBEDDINGS_URL, EmbeddingsBody
from batchinfer.jobs.input.responses_line import ResponsesBody
from batchinfer.jobs.input.line_problems import Problem, first, one_per_param, problems
from batchinfer.jobs.output.records import PreparedRequest

__all__ = ["PreparedRequest", "LineError", "ValidationLimits", "ValidationReport", "validate_stream"]
M = TypeVar("M", bound=BaseModel)

CODES = ("invalid_json_line", "invalid_utf8", "not_an_object", "missing_field", "invalid_field",
         "duplicate_custom_id", "unsupported_url", "model_not_found", "empty_file", "too_many_requests",
         "line_too_long", "file_too_large", "context_length_exceeded")


@dataclass
class LineError:
    line: int | None
    code: str
    message: str
    param: str | None = None
    custom_id: str | None = None

    def to_dict(self) -> dict:
        return {"line": self.line, "code": self.code, "param": self.param, "message": self.message}

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "file"
        return f"{where}: {self.code}: {self.message}"


@dataclass
class ValidationLimits:
    model_id: str
    max_model_len: int
    max_requests: int = 50_000
    max_line_bytes: int = 1_000_000
    max_file_bytes: int = 200 * 1024 * 1024
    default_max_tokens: int = 256
    max_errors_kept: int = 1000
    endpoint: str | None = None  # the batch's (None: a file submitted without one)


@dataclass
class ValidationReport:
    lines: int = 0  # non-blank lines seen
    valid: int = 0
    error_count: int = 0
    errors: list[LineError] = field(default_factory=list)  # the first max_errors_kept
    file_error: bool = False  # a whole-file problem (empty, too large, too many requests)

    @property
    def ok(self) -> bool:
        return self.error_count == 0


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


def validate_stream(stream: BinaryIO, tokenizer, limits: ValidationLimits,
                    on_valid: Callable[[PreparedRequest], None],
                    on_invalid: Callable[[LineError], None] | None = None) -> ValidationReport:
    report = ValidationReport()
    seen_ids: set[str] = set()

    def record(error: LineError) -> None:
        report.error_count += 1
        if len(report.errors) < limits.max_errors_kept:
            report.errors.append(error)
        if on_invalid and error.line is not None and not report.file_error:
            on_invalid(error)

    for number, raw in _read_lines(stream, limits, report, record):
        report.lines += 1
        if report.lines > limits.max_requests:
            report.file_error = True
            record(LineError(number, "too_many_requests", f"the file has more than {limits.max_requests} requests"))
            break
        problems, prepared = _check_line(number, raw, report.valid, tokenizer, limits, seen_ids)
        if prepared is None:
            record(problems[0])
            for problem in problems[1:]:
                _count_extra(report, problem, limits)
        else:
            report.valid += 1
            on_valid(prepared)
    if report.lines == 0 and not report.file_error:
        report.file_error = True
        record(LineError(None, "empty_file", "the file has no requests"))
    return report


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


def _check_line(number, raw, index, tokenizer, limits, seen_ids) -> tuple[list[LineError], PreparedRequest | None]:
    try:
        return [], _prepare(number, raw, index, tokenizer, limits, seen_ids)
    except _Rejected as rejected:
        return [LineError(number, *problem) for problem in rejected.problems], None


def _prepare(number, raw, index, tokenizer, limits: ValidationLimits, seen_ids: set[str]) -> PreparedRequest:
    line, custom_id = _envelope(_decode(raw), seen_ids)
    model = line.body.get("model", limits.model_id)
    if model != limits.model_id:
        raise _Rejected(("model_not_found", f"model {shown(model)} is not served here (use {limits.model_id!r})",
                         "body.model", custom_id))
    _check_endpoint(line.url, limits.endpoint, custom_id)
    body = _body(line, custom_id)
    if isinstance(body, EmbeddingsBody):
        return _prepare_embedding(index, number, custom_id, line.url, model, body, tokenizer, limits)
    prompt_ids = list(tokenizer.encode(body.prompt_text(tokenizer), add_special_tokens=False))
    sampling = body.params(limits.default_max_tokens)
    needed = len(prompt_ids) + sampling.max_tokens
    if needed > limits.max_model_len:
        raise _Rejected(("context_length_exceeded",
                         f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) = {needed} "
                         f"is over the model's context of {limits.max_model_len} tokens", "body.max_tokens", custom_id))
    echo = body.echo() if isinstance(body, ResponsesBody) else None
    _check_token_ids(sampling, len(tokenizer), custom_id)
    _check_constraint(body, custom_id)
    return PreparedRequest(index, number, custom_id, line.url, model, prompt_ids, sampling, echo)


def _check_endpoint(url: str, endpoint: str | None, custom_id: str) -> None:
    """An embeddings batch holds only embedding lines, and embedding lines only go in one (as OpenAI requires)."""
    if endpoint is not None and (url == EMBEDDINGS_URL) != (endpoint == EMBEDDINGS_URL):
        raise _Rejected(("unsupported_url", f"a line for {url} cannot be in a batch whose endpoint is {endpoint}",
                         "url", custom_id))


def _prepare_embedding(index, number, custom_id, url, model, body: EmbeddingsBody, tokenizer,
                       limits: ValidationLimits) -> PreparedRequest:
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
    return PreparedRequest(index, number, custom_id, url, model, inputs[0], body.params(limits.default_max_tokens),
                           body.echo(inputs))


def _check_constraint(body: Sampling | ResponsesBody, custom_id: str) -> None:
    """At most one output constraint, and one the grammar library can compile (found here, at submit time)."""
    given = body.constraints_given()
    if len(given) > 1:
        raise _Rejected(("invalid_field", f"body.{given[1]} cannot be combined with body.{given[0]}",
                         f"body.{given[1]}", custom_id))
    constraint = body.constraint()
    if constraint is None:
        return
    from batchinfer.engine.grammar import check_constraint  # the grammar library loads only for lines that need it

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
