"""Every error code a client reads, in one table: OpenAI's own code wherever OpenAI has one (with the wording and the
param OpenAI gives), ours only where OpenAI has no word for the problem. docs/batch-format.md lists the same table.

Where a code appears:
- `batch`: in a failed batch's `errors.data` (a problem of the file or of a line's envelope: the batch fails at
  validation and nothing runs), each with its line and param;
- `request`: in the error file, as that request's own HTTP 400 (`response.status_code` 400 and OpenAI's error body)
  while the rest of the batch runs;
- `run`: in the error file, for a request that ended without a result (cancelled, expired, a server error);
- `http`: an HTTP error of the API itself (`{"error": {"message", "type", "param", "code"}}`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorCode:
    code: str
    ours: bool  # True: OpenAI has no code for this problem
    where: tuple[str, ...]
    meaning: str


def _codes(*entries: ErrorCode) -> dict[str, ErrorCode]:
    return {e.code: e for e in entries}


OPENAI, OURS = False, True
BATCH, REQUEST, RUN, HTTP = "batch", "request", "run", "http"

TABLE: dict[str, ErrorCode] = _codes(
    # a failed batch's errors (file and envelope problems)
    ErrorCode("invalid_request", OPENAI, (BATCH, REQUEST),
              "the input file cannot be found (param file_id); a line that is not a JSON object; a body without its "
              "model or its prompt field (body.model, body.messages, body.prompt, body.input)"),
    ErrorCode("invalid_json_line", OPENAI, (BATCH,), "a line that is not parseable as JSON (or not UTF-8)"),
    ErrorCode("missing_required_parameter", OPENAI, (BATCH, REQUEST),
              "custom_id, method, url or body missing (batch); a required field of the body missing (request)"),
    ErrorCode("invalid_type", OPENAI, (BATCH, REQUEST, HTTP), "a field of the wrong JSON type"),
    ErrorCode("invalid_value", OPENAI, (BATCH, REQUEST, HTTP),
              "a field whose value is not one we take (method not POST, an unknown endpoint or completion window...)"),
    ErrorCode("invalid_url", OPENAI, (BATCH, HTTP),
              "a line's url that does not match the batch's endpoint, or no endpoint served; a request URL with control "
              "characters"),
    ErrorCode("streaming_unsupported", OPENAI, (BATCH,), "body.stream is true"),
    ErrorCode("model_not_found", OPENAI, (BATCH, HTTP), "body.model names a model nobody serves"),
    ErrorCode("duplicate_custom_id", OPENAI, (BATCH,), "a custom_id used by an earlier line"),
    ErrorCode("empty_file", OPENAI, (BATCH,), "the file holds no request"),
    ErrorCode("mismatched_model", OURS, (BATCH,), "a line naming another served model than the batch's (one model a batch)"),
    ErrorCode("too_many_requests", OURS, (BATCH,), "more lines than BATCHINFER_MAX_REQUESTS_PER_FILE"),
    ErrorCode("line_too_long", OURS, (BATCH,), "a line over BATCHINFER_MAX_LINE_BYTES"),
    ErrorCode("file_too_large", OURS, (BATCH, HTTP), "the file over BATCHINFER_MAX_FILE_BYTES"),
    # a request's own 400 (a body the model cannot take), while the rest runs
    ErrorCode("context_length_exceeded", OPENAI, (REQUEST,), "prompt tokens + max_tokens over the model's context"),
    ErrorCode("unsupported_parameter", OPENAI, (REQUEST,), "a field this server does not serve (tools, audio...)"),
    ErrorCode("integer_below_min_value", OPENAI, (REQUEST,), "an integer under its minimum"),
    ErrorCode("integer_above_max_value", OPENAI, (REQUEST,), "an integer over its maximum"),
    ErrorCode("decimal_below_min_value", OPENAI, (REQUEST,), "a number under its minimum"),
    ErrorCode("decimal_above_max_value", OPENAI, (REQUEST,), "a number over its maximum"),
    ErrorCode("empty_string", OPENAI, (REQUEST,), "an empty string where one is needed"),
    ErrorCode("string_above_max_length", OPENAI, (BATCH, REQUEST), "a string over its maximum length"),
    ErrorCode("empty_array", OPENAI, (REQUEST,), "an empty array where one is needed"),
    ErrorCode("array_above_max_length", OPENAI, (REQUEST,), "an array over its maximum length"),
    # a request that ended without a result
    ErrorCode("batch_cancelled", OPENAI, (RUN,), "the batch was cancelled before the request finished"),
    ErrorCode("batch_expired", OPENAI, (RUN,), "the completion window passed before the request finished"),
    ErrorCode("server_error", OPENAI, (RUN, BATCH), "the server failed the request (or the batch's validation)"),
    ErrorCode("max_error_rate_exceeded", OURS, (BATCH,),
              "the share of failed requests passed the batch's metadata max_error_rate: it stopped, failed"),
    # the HTTP API
    ErrorCode("invalid_api_key", OPENAI, (HTTP,), "a key that is wrong or revoked (401)"),
    ErrorCode("rate_limit_exceeded", OPENAI, (HTTP,), "too many requests for this key (429, Retry-After)"),
    ErrorCode("missing_api_key", OURS, (HTTP,), "no key sent (401)"),
    ErrorCode("too_many_auth_failures", OURS, (HTTP,), "too many failed authentications from one address (429)"),
    ErrorCode("too_many_uploads", OURS, (HTTP,), "more uploads of one key in flight than allowed (429)"),
    ErrorCode("too_many_estimates", OURS, (HTTP,), "more estimates of one key in flight than allowed (429)"),
    ErrorCode("too_many_active_batches", OURS, (HTTP,), "more unfinished batches of one key than allowed (429)"),
    ErrorCode("request_too_large", OURS, (HTTP,), "a JSON body over BATCHINFER_MAX_JSON_BYTES (413)"),
    ErrorCode("not_admin", OURS, (HTTP,), "an admin key's route asked with another key (403)"),
    ErrorCode("estimate_failed", OURS, (HTTP,), "the dry-run estimate of a file failed (400)"),
    ErrorCode("estimate_timeout", OURS, (HTTP,), "no estimate came back in time (503)"),
    ErrorCode("broker_unavailable", OURS, (HTTP,), "the broker does not answer: an estimate cannot be queued (503)"),
    ErrorCode("database_unavailable", OURS, (HTTP,), "the database does not answer (503, Retry-After)"),
    ErrorCode("not_found", OURS, (HTTP,), "no such batch or file for this key (OpenAI answers 404 with code null)"),
    ErrorCode("idempotency_conflict", OURS, (HTTP,), "an Idempotency-Key used before with another body (409)"),
    ErrorCode("conflict", OURS, (HTTP,), "a retry of a batch that has not ended (409)"),
    ErrorCode("nothing_to_retry", OURS, (HTTP,), "a retry of a batch with no failed, expired or cancelled request"),
)

BATCH_CODES = tuple(c for c, e in TABLE.items() if BATCH in e.where)
FILE_CODES = ("empty_file", "too_many_requests", "file_too_large")  # of the whole file, not of one line
REQUEST_CODES = tuple(c for c, e in TABLE.items() if REQUEST in e.where)


def code(name: str) -> str:
    """The code, checked against the table (a typo fails where it is written, not in a client)."""
    if name not in TABLE:
        raise KeyError(f"{name!r} is not in batchinfer.error_codes.TABLE")
    return name


# ---- OpenAI's wording ---------------------------------------------------------------------------------------

def missing(param: str) -> str:
    return f"Missing required parameter: {param!r}."


def invalid_type(param: str, expected: str, value) -> str:
    return f"Invalid type for {param!r}: expected {expected}, but got {json_type(value)} instead."


def invalid_value(value: str, supported: list[str]) -> str:
    """value: already shown (repr'd and cut short)."""
    return f"Invalid value: {value}. Supported values are: {listed(supported)}."


def listed(values: list[str]) -> str:
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def not_parseable(detail: str) -> str:
    return f"This line is not parseable as valid JSON ({detail})."


URL_MISMATCH = "The URL provided for this request does not match the batch endpoint."
DUPLICATE_CUSTOM_ID = ("The custom_id for this request is a duplicate of another request. The custom_id parameter must "
                       "be unique for each request in a batch.")


def streaming_unsupported(kind: str) -> str:
    return f"{kind}: Streaming is not supported in the Batch API."


def model_unsupported(model: str) -> str:
    """model: already shown."""
    return f"The provided model {model} is not supported by the Batch API."


def parameter_required(field: str) -> str:
    return f"{field.capitalize()} parameter is required."


def context_exceeded(limit: int, prompt: int, completion: int, prompt_field: str) -> str:
    return (f"This model's maximum context length is {limit} tokens. However, you requested {prompt + completion} tokens "
            f"({prompt} in the {prompt_field}, {completion} in the completion). Please reduce the length of the "
            f"{prompt_field} or completion.")


def file_not_found(file_id: str) -> str:
    """file_id: already shown."""
    return f"Cannot find file {file_id}, or this API key does not have access to it."


def batch_not_found(batch_id: str) -> str:
    """batch_id: already shown."""
    return f"No batch found with id {batch_id}."


def cannot_cancel(status: str) -> str:
    return f"Cannot cancel a batch with status {status!r}."


def cannot_pause(status: str) -> str:
    return f"Cannot pause a batch with status {status!r}: only a queued or in_progress batch pauses."


def cannot_resume(status: str) -> str:
    return f"Cannot resume a batch with status {status!r}: only a paused batch resumes."
