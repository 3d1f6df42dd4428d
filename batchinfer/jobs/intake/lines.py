"""Streaming validation of an OpenAI Batch input file.

Every line is checked (nothing runs before the whole file has been read); each problem is reported with
its line number, a code and the field, in OpenAI's codes (batchinfer.error_codes). OpenAI's split: a problem of
the file or of a line's envelope (JSON, custom_id, method, url, the body's model, stream and prompt field) fails
the batch; a body the endpoint refuses is that request's own 400 while the rest runs (LineError.per_request),
unless the limits are strict. Valid lines are tokenized here with the model's chat template, so the token ids
travel with the job and workers never re-tokenize.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterable, TypeVar, cast

from pydantic import BaseModel, ValidationError

from batchinfer import error_codes as E
from batchinfer.errors import excerpt, shown
from batchinfer.jobs.endpoints.anthropic import MESSAGES_ENDPOINT, Params
from batchinfer.jobs.endpoints.batch_line import InputLine
from batchinfer.jobs.endpoints.chat import ChatBody
from batchinfer.jobs.endpoints.completions import CompletionBody
from batchinfer.jobs.endpoints.embeddings import EMBEDDINGS_URL, EmbeddingsBody
from batchinfer.jobs.endpoints.kinds import BODIES, Body, KIND_NAMES
from batchinfer.jobs.endpoints.responses import ResponsesBody
from batchinfer.jobs.endpoints.sampling import Sampling
from batchinfer.jobs.intake.line_problems import Problem, first, one_per_param, problems
from batchinfer.jobs.records import LineError, PreparedRequest, ValidationReport
from batchinfer.settings import Settings

M = TypeVar("M", bound=BaseModel)

CODES = E.BATCH_CODES + E.REQUEST_CODES  # every code validation may report


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
    adapters: tuple[str, ...] = ()  # the LoRA adapters of model_id: a line may name one (docs/adapters.md)
    sampling_defaults: dict = field(default_factory=dict)  # the checkpoint's generation_config.json defaults
    model_served: bool = True  # False: nobody serves model_id (lines are checked on another model's tokenizer)
    strict: bool = False  # every problem fails the batch, a refused body too (the CLI's --strict)


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
            on_error(LineError(number, E.code("file_too_large"), f"The file is over {limits.max_file_bytes} bytes."))
            return
        if too_long:
            report.lines += 1
            on_error(LineError(number, E.code("line_too_long"), f"The line is over {limits.max_line_bytes} bytes."))
            continue
        if raw.strip():
            yield number, raw


CHUNK_LINES = 256  # lines parsed, then tokenized in one batch call, then reported in line order


def validate_stream(stream: BinaryIO, tokenizer, limits: ValidationLimits,
                    on_valid: Callable[[ValidLine], None],
                    on_invalid: Callable[[LineError], None] | None = None,
                    on_progress: Callable[[], None] | None = None) -> ValidationReport:
    """on_progress: called after each line is parsed, so a caller renews its lease through a chunk of slow lines."""
    report = ValidationReport()
    seen_ids: set[str] = set()
    chunk: list[tuple[int, bytes]] = []

    def record(error: LineError) -> None:
        _count_extra(report, error, limits)
        report.refused += error.per_request
        if on_invalid and error.line is not None and not report.file_error:
            on_invalid(error)

    def flush() -> None:
        """The chunk's lines, reported in line order (the error file stays sorted by line)."""
        for found, prepared in _check_chunk(chunk, report.valid, tokenizer, limits, seen_ids, on_progress):
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
            record(LineError(number, E.code("too_many_requests"), f"The file has more than {limits.max_requests} requests."))
            break
        chunk.append((number, raw))
        if len(chunk) >= CHUNK_LINES:
            flush()
    flush()
    if report.lines == 0 and not report.file_error:
        report.file_error = True
        record(LineError(None, E.code("empty_file"), "The batch input file is empty: it holds no request."))
    return report


def not_served(model, served: Iterable[str]) -> str:
    """The one line a batch (or a line) naming a model nobody serves fails with: the served ones listed."""
    names = ", ".join(repr(m) for m in served) or "none"
    return f"{E.model_unsupported(shown(model))[:-1]} (served here: {names})."


def unserved_model_report(model, served: Iterable[str]) -> ValidationReport:
    """A batch whose model nobody serves, where no model at all is served to check its lines with: it fails whole."""
    error = LineError(None, E.code("model_not_found"), not_served(model, served), "body.model")
    return ValidationReport(error_count=1, errors=[error], file_error=True)


def _line_model(body: dict, limits: ValidationLimits, custom_id) -> str:
    """The model a line names, checked: the API's batches need it (as OpenAI's); a file from the CLI may leave it out
    (the batch's). Every line of a batch names the batch's model, and a served one."""
    if "model" not in body and limits.endpoint is not None:
        raise _Rejected(("invalid_request", E.parameter_required("model"), "body.model", custom_id))
    model = body.get("model", limits.model_id)
    if (model == limits.model_id or model in limits.adapters) and limits.model_served:
        return model
    if model != limits.model_id and model in limits.served_models:
        raise _Rejected(("mismatched_model", f"The provided model {shown(model)} is not the batch's model "
                         f"{limits.model_id!r}: every request of a batch names the same model.", "body.model", custom_id))
    served = (limits.served_models or ((limits.model_id,) if limits.model_served else ())) + limits.adapters
    raise _Rejected(("model_not_found", not_served(model, served), "body.model", custom_id))


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
    except (ValueError, AttributeError, RecursionError):  # a line too deep is its own error, found by validation
        return None
    return model if isinstance(model, str) and model else None


class _Replay:
    """A stream's lines already read, then the rest of it: validation reads it by readline(size) only."""

    def __init__(self, head: list[bytes], rest: BinaryIO):
        self.head, self.rest = head, rest

    def readline(self, size: int = -1) -> bytes:
        return self.head.pop(0) if self.head else self.rest.readline(size)


def _count_extra(report: ValidationReport, error: LineError, limits: ValidationLimits) -> None:
    """A problem counted and kept (the first max_errors_kept); a second one on the same line is reported this way
    too, but produces no extra error-file line. Strict limits make a refused body fail the batch."""
    error.per_request = error.per_request and not limits.strict
    if error.per_request:
        if len(report.request_errors) < limits.max_errors_kept:
            report.request_errors.append(error)
        return
    report.error_count += 1
    if len(report.errors) < limits.max_errors_kept:
        report.errors.append(error)


class _Rejected(Exception):
    """A line's problems as (code, message, param, custom_id): the first one goes to the error file. per_request: a
    body the endpoint refuses (the request's own 400), else a problem that fails the batch."""

    def __init__(self, *problems: tuple[str, str, str | None, str | None], per_request: bool = False):
        super().__init__(problems[0][1])
        self.problems = problems
        self.per_request = per_request

    def errors(self, number: int) -> list[LineError]:
        return [LineError(number, *problem, per_request=self.per_request) for problem in self.problems]


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
                 seen_ids: set[str], on_progress: Callable[[], None] | None = None,
                 ) -> list[tuple[list[LineError], ValidLine | None]]:
    """(problems, prepared) per line, in order; indexes count the valid lines from first_index. The checks run
    as they did one line at a time: parse and check the envelope and body, render the prompt, then (after the
    chunk's one encode call) the checks on token counts and ids."""
    parsed: list[_Parsed | ValidLine | list[LineError]] = []
    for number, raw in chunk:  # in line order: the first line with a custom_id keeps it
        try:
            parsed.append(_parse_line(number, raw, tokenizer, limits, seen_ids))
        except _Rejected as rejected:
            parsed.append(rejected.errors(number))
        if on_progress is not None:
            on_progress()
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
                results.append((rejected.errors(p.number), None))
                continue
            finally:  # a grammar is compiled here: up to its deadline a line
                if on_progress is not None:
                    on_progress()
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
    """Every check but those that need the token ids; an embeddings line is done here (index set by the caller).
    The envelope's checks first (each fails the batch), then the body's (each fails the request alone)."""
    line, custom_id = _envelope(_decode(raw), seen_ids)
    _check_endpoint(line.url, limits.endpoint, custom_id)
    model = _line_model(line.body, limits, custom_id)
    _check_envelope_of_body(line, custom_id)
    body = _body(line, custom_id)
    if isinstance(body, EmbeddingsBody):
        return _prepare_embedding(0, number, custom_id, line.url, model, body, tokenizer, limits)
    return _Parsed(number, custom_id, line.url, model, body, _prompt_text(body, tokenizer, custom_id))


def _prompt_text(body: ChatBody | CompletionBody | ResponsesBody | Params, tokenizer, custom_id: str) -> str:
    """The rendered prompt; a conversation the model's own chat template refuses (it raises on a role order, a tool
    message it cannot place) is that request's error, in the template's words."""
    try:
        return body.prompt_text(tokenizer)
    except Exception as exc:
        if not (type(exc).__module__.startswith("jinja2") or isinstance(exc, (ValueError, TypeError))):
            raise
        field = type(body).PROMPT_FIELD
        raise _Rejected(("invalid_value", f"Invalid value for {field!r}: the model's chat template cannot render "
                         f"them: {excerpt(str(exc) or type(exc).__name__)}.", f"body.{field}", custom_id),
                        per_request=True) from None


def _prepare(p: _Parsed, prompt_ids: list[int], index: int, tokenizer, limits: ValidationLimits) -> ValidLine:
    body, custom_id = p.body, p.custom_id
    sampling = body.params(limits.default_max_tokens, limits.sampling_defaults)
    needed = len(prompt_ids) + sampling.max_tokens
    if needed > limits.max_model_len:
        prompt_field = type(body).PROMPT_FIELD
        raise _Rejected(("context_length_exceeded", E.context_exceeded(limits.max_model_len, len(prompt_ids),
                                                                        sampling.max_tokens, prompt_field),
                         f"body.{prompt_field}", custom_id), per_request=True)
    echo = body.echo(tokenizer) if isinstance(body, (ChatBody, Params, ResponsesBody)) else None
    _check_token_ids(sampling, len(tokenizer), custom_id)
    if not isinstance(body, EmbeddingsBody):  # embeddings lines are prepared apart and take no constraint
        _check_constraint(body, custom_id)
    return ValidLine(p.number, custom_id, PreparedRequest(index, p.url, p.model, prompt_ids, sampling, echo))


def _check_endpoint(url: str, endpoint: str | None, custom_id: str) -> None:
    """An embeddings batch holds only embedding lines, and embedding lines only go in one (as OpenAI requires); the
    generating endpoints may share a batch (ours: docs/endpoints.md). A Message Batch's lines go only in one."""
    if ((endpoint is not None and (url == EMBEDDINGS_URL) != (endpoint == EMBEDDINGS_URL))
            or (url == MESSAGES_ENDPOINT) != (endpoint == MESSAGES_ENDPOINT)):
        raise _Rejected(("invalid_url", f"{E.URL_MISMATCH[:-1]} ({url} in a batch whose endpoint is {endpoint}).",
                         "url", custom_id))


def _check_envelope_of_body(line: InputLine, custom_id: str) -> None:
    """What OpenAI checks of a body at validation (a problem fails the batch): no stream, and the prompt field."""
    if line.body.get("stream") is True:
        raise _Rejected(("streaming_unsupported", E.streaming_unsupported(KIND_NAMES[line.url]), "body.stream", custom_id))
    prompt_field = BODIES[line.url].PROMPT_FIELD
    if prompt_field not in line.body:
        raise _Rejected(("invalid_request", E.parameter_required(prompt_field), f"body.{prompt_field}", custom_id))


def _prepare_embedding(index, number, custom_id, url, model, body: EmbeddingsBody, tokenizer,
                       limits: ValidationLimits) -> ValidLine:
    inputs = body.token_inputs(tokenizer)
    vocab = len(tokenizer)
    for k, ids in enumerate(inputs):
        if not ids:
            raise _Rejected(("invalid_value", f"Invalid value for 'input': input {k} has no tokens.", "body.input",
                             custom_id), per_request=True)
        if max(ids) >= vocab:
            raise _Rejected(("invalid_value", f"Invalid value for 'input': input {k} holds token id {max(ids)}, not in "
                             f"the vocabulary of {vocab}.", "body.input", custom_id), per_request=True)
        if len(ids) >= limits.max_model_len:
            raise _Rejected(("context_length_exceeded", f"This model's maximum context length is {limits.max_model_len} "
                             f"tokens. However, input {k} has {len(ids)} tokens. Please reduce the length of the input.",
                             "body.input", custom_id), per_request=True)
    return ValidLine(number, custom_id, PreparedRequest(index, url, model, inputs[0],
                                                        body.params(limits.default_max_tokens), body.echo(inputs)))


def _check_constraint(body: Sampling | ResponsesBody | Params, custom_id: str) -> None:
    """At most one output constraint, and one the grammar library can compile (found here, at submit time)."""
    given = body.constraints_given()
    if len(given) > 1:
        raise _Rejected(("invalid_value", f"Invalid value for {given[1]!r}: it cannot be combined with {given[0]!r}.",
                         f"body.{given[1]}", custom_id), per_request=True)
    constraint = body.constraint()
    if constraint is None:
        return
    from batchinfer.engine.sampling.grammar_check import check_constraint  # the grammar library loads only for lines that need it

    reason = check_constraint(*constraint)
    if reason is not None:
        raise _Rejected(("invalid_value", f"Invalid value for {given[0]!r}: {excerpt(reason)}.", f"body.{given[0]}",
                         custom_id), per_request=True)


def _check_token_ids(sampling, vocab_size: int, custom_id: str) -> None:
    """Token ids the line names must be in the vocabulary; min_tokens must leave room under max_tokens."""
    for param, ids in (("body.logit_bias", sampling.logit_bias), ("body.stop_token_ids", sampling.stop_token_ids)):
        outside = [t for t in ids if t >= vocab_size]
        if outside:
            raise _Rejected(("invalid_value", f"Invalid value for {param.removeprefix('body.')!r}: token {outside[0]} "
                             f"is outside the vocabulary (ids 0 to {vocab_size - 1}).", param, custom_id), per_request=True)
    if sampling.min_tokens > sampling.max_tokens:
        raise _Rejected(("invalid_value", f"Invalid value for 'min_tokens': {sampling.min_tokens} is over max_tokens "
                         f"({sampling.max_tokens}).", "body.min_tokens", custom_id), per_request=True)


def _decode(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except UnicodeDecodeError as exc:  # JSON is UTF-8: a line that is not cannot be parsed
        raise _Rejected(("invalid_json_line", E.not_parseable(f"it is not valid UTF-8: byte {exc.start}"), None,
                         None)) from None
    except (ValueError, RecursionError) as exc:  # ValueError also covers an integer of over 4300 digits
        reason = _json_position(exc, text) if isinstance(exc, json.JSONDecodeError) else _json_limit(exc)
        raise _Rejected(("invalid_json_line", E.not_parseable(reason), None, None)) from None
    if not isinstance(obj, dict):
        raise _Rejected(("invalid_request", f"Each line must be a JSON object; this line is {E.json_type(obj)}.",
                         None, None))
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
    if problem and (problem.code == "missing_required_parameter" or problem.path == ("custom_id",)):
        raise _Rejected((problem.code, problem.message, problem.param, custom_id))
    if custom_id in seen_ids:
        raise _Rejected(("duplicate_custom_id", f"{E.DUPLICATE_CUSTOM_ID} {shown(custom_id)} is used by an earlier line.",
                         "custom_id", custom_id))
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
        raise _Rejected(*[(p.code, p.message, p.param, custom_id) for p in reported], per_request=True)
    return body


def _parse(model: type[M], data: dict, prefix: str = "") -> tuple[M | None, list[Problem]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, problems(exc, data, prefix, model)
