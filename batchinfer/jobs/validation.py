"""Streaming validation of an OpenAI Batch input file.

Every line is checked (nothing runs before the whole file has been read); each problem is reported with
its line number, a code and the field. Valid lines are tokenized here with the model's chat template, so
the token ids travel with the job and workers never re-tokenize.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.records import PreparedRequest

__all__ = ["PreparedRequest", "LineError", "ValidationLimits", "ValidationReport", "validate_stream"]

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
SUPPORTED_URLS = (CHAT_URL, COMPLETIONS_URL)
ROLES = ("system", "user", "assistant", "developer")
MAX_STOP = 4

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


class _FieldProblem(Exception):
    def __init__(self, code: str, param: str, message: str):
        super().__init__(message)
        self.code, self.param, self.message = code, param, message


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
        if problems:
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


def _check_line(number, raw, index, tokenizer, limits, seen_ids) -> tuple[list[LineError], PreparedRequest | None]:
    def fail(code: str, message: str, param: str | None = None, custom_id: str | None = None):
        return [LineError(number, code, message, param, custom_id)], None

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return fail("invalid_utf8", f"the line is not valid UTF-8 (byte {exc.start})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return fail("invalid_json_line", f"the line is not valid JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return fail("not_an_object", f"the line is a JSON {type(obj).__name__}, not an object")
    missing = [name for name in ("custom_id", "method", "url", "body") if name not in obj]
    if missing:
        return fail("missing_field", f"missing field '{missing[0]}'", missing[0], _custom_id(obj))
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return fail("invalid_field", "custom_id must be a non-empty string", "custom_id")
    if custom_id in seen_ids:
        return fail("duplicate_custom_id", f"custom_id '{custom_id}' appears more than once", "custom_id", custom_id)
    seen_ids.add(custom_id)
    if obj["method"] != "POST":
        return fail("invalid_field", f"method must be POST, got {obj['method']!r}", "method", custom_id)
    if obj["url"] not in SUPPORTED_URLS:
        return fail("unsupported_url", f"url {obj['url']!r} is not one of {', '.join(SUPPORTED_URLS)}", "url", custom_id)
    body = obj["body"]
    if not isinstance(body, dict):
        return fail("invalid_field", "body must be an object", "body", custom_id)
    model = body.get("model", limits.model_id)
    if model != limits.model_id:
        return fail("model_not_found", f"model {model!r} is not served here (use {limits.model_id!r})",
                    "body.model", custom_id)
    problems: list[LineError] = []
    try:
        prompt_ids = _tokenize(obj["url"], body, tokenizer)
    except _FieldProblem as problem:
        problems.append(LineError(number, problem.code, problem.message, problem.param, custom_id))
        prompt_ids = None
    sampling: dict[str, Any] = {}
    for bad in _parse_sampling(body, limits.default_max_tokens, sampling):
        problems.append(LineError(number, bad.code, bad.message, bad.param, custom_id))
    if problems:
        return problems, None
    needed = len(prompt_ids) + sampling["max_tokens"]
    if needed > limits.max_model_len:
        return fail("context_length_exceeded",
                    f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling['max_tokens']}) = {needed} "
                    f"is over the model's context of {limits.max_model_len} tokens", "body.max_tokens", custom_id)
    return [], PreparedRequest(index, number, custom_id, obj["url"], model, prompt_ids, SamplingParams(**sampling))


def _custom_id(obj: dict) -> str | None:
    value = obj.get("custom_id")
    return value if isinstance(value, str) else None


def _tokenize(url: str, body: dict, tokenizer) -> list[int]:
    if url == CHAT_URL:
        if "messages" not in body:
            raise _FieldProblem("missing_field", "body.messages", "missing field 'body.messages'")
        messages = _check_messages(body["messages"])
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        if "prompt" not in body:
            raise _FieldProblem("missing_field", "body.prompt", "missing field 'body.prompt'")
        text = body["prompt"]
        if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
            text = text[0]
        if not isinstance(text, str) or not text:
            raise _FieldProblem("invalid_field", "body.prompt", "prompt must be a non-empty string")
    return list(tokenizer.encode(text, add_special_tokens=False))


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _FieldProblem("invalid_field", "body.messages", "messages must be a non-empty array")
    checked = []
    for i, message in enumerate(messages):
        param = f"body.messages[{i}]"
        if not isinstance(message, dict):
            raise _FieldProblem("invalid_field", param, f"{param} must be an object")
        if "role" not in message or "content" not in message:
            name = "role" if "role" not in message else "content"
            raise _FieldProblem("missing_field", f"{param}.{name}", f"missing field '{param}.{name}'")
        if message["role"] not in ROLES:
            raise _FieldProblem("invalid_field", f"{param}.role", f"role must be one of {', '.join(ROLES)}")
        role = "system" if message["role"] == "developer" else message["role"]
        checked.append({"role": role, "content": _content_text(message["content"], f"{param}.content")})
    return checked


def _content_text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _FieldProblem("invalid_field", param, f"{param} must be a string or a list of text parts")


def _parse_sampling(body: dict, default_max_tokens: int, out: dict) -> list[_FieldProblem]:
    problems = []

    def number(name, low, high, default, integer=False, low_open=False):
        value = body.get(name, default)
        if value is None:
            value = default
        kind = int if integer else (int, float)
        bad = isinstance(value, bool) or not isinstance(value, kind) or (isinstance(value, float) and not math.isfinite(value))
        if not bad:
            bad = value < low or (low_open and value == low) or (high is not None and value > high)
        if bad:
            span = f"({low}, {high}]" if low_open else f"[{low}, {high if high is not None else 'inf'}]"
            problems.append(_FieldProblem("invalid_field", f"body.{name}",
                                          f"{name} must be {'an integer' if integer else 'a number'} in {span}, got {value!r}"))
            return default
        return value

    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        problems.append(_FieldProblem("invalid_field", f"body.{name}", f"{name} must be an integer >= 1, got {max_tokens!r}"))
        max_tokens = 1
    out["max_tokens"] = max_tokens
    out["temperature"] = float(number("temperature", 0, 2, 1.0))
    out["top_p"] = float(number("top_p", 0, 1, 1.0, low_open=True))
    top_k = body.get("top_k", 0)
    out["top_k"] = 0 if top_k == -1 else number("top_k", 0, None, 0, integer=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        problems.append(_FieldProblem("invalid_field", "body.seed", f"seed must be an integer, got {seed!r}"))
        seed = None
    out["seed"] = seed
    out["stop"] = _parse_stop(body.get("stop"), problems)
    n = body.get("n", 1)
    if n != 1:
        problems.append(_FieldProblem("invalid_field", "body.n", f"only n=1 is supported, got {n!r}"))
    return problems


def _parse_stop(stop, problems) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        problems.append(_FieldProblem("invalid_field", "body.stop",
                                      f"stop must be a non-empty string or a list of up to {MAX_STOP} of them"))
        return []
    return stop
