"""A line of the OpenAI Batch format, in and out: the input line's envelope (custom_id's one home), and the
output and error lines around a result body, with per-request metrics."""
from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from batchinfer.jobs.endpoints import kinds
from batchinfer.jobs.endpoints.fields import valid_unicode
from batchinfer.jobs.records import output_line_bytes

CUSTOM_ID_MAX_CHARS = 512  # the requests.custom_id column


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise PydanticCustomError("invalid_field", "must not contain a NUL character")
    return text


CustomId = Annotated[StrictStr, Field(min_length=1, max_length=CUSTOM_ID_MAX_CHARS), AfterValidator(valid_unicode),
                     AfterValidator(_no_nul)]


class InputLine(BaseModel):
    """One line's envelope; its body is checked by the model of its url (kinds.BODIES)."""

    model_config = ConfigDict(extra="ignore")

    custom_id: CustomId = Field(description=f"a non-empty string of at most {CUSTOM_ID_MAX_CHARS} characters")
    method: Literal["POST"] = Field(description="POST")
    url: StrictStr = Field(description=f"one of {', '.join(kinds.URLS)}")
    body: dict[str, Any] = Field(description="an object")

    @field_validator("url")
    @classmethod
    def _served(cls, url: str) -> str:
        if url not in kinds.BODIES:
            raise PydanticCustomError("invalid_url", "not an endpoint served here")
        return url


def request_id(job_id: str, index: int) -> str:
    """Deterministic, so a unit that runs twice writes the same ids."""
    return hashlib.sha1(f"{job_id}:{index}".encode()).hexdigest()[:24]


def metrics(result, worker: str) -> dict:
    return {"queue_s": round(result.queue_s, 6), "ttft_s": round(result.ttft_s, 6),
            "tpot_s": round(result.tpot_s, 6), "e2e_s": round(result.e2e_s, 6), "worker": worker}


def output_line(job_id: str, index: int, custom_id: str, url: str, model: str, results: list, worker: str,
                echo: dict | None = None) -> dict:
    """A finished request's line: `results` is its result (an embeddings line: one per input, in order)."""
    rid = request_id(job_id, index)
    return {"id": f"batch_req_{rid}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": rid,
                         "body": kinds.result_body(url, rid, model, results, echo)},
            "error": None, "metrics": metrics(results[-1], worker)}


def error_line(job_id: str, index: int | None, custom_id: str | None, code: str, message: str,
               line: int | None = None, param: str | None = None, status: int | None = None) -> dict:
    """A request without a result. status 400: a body the endpoint refuses, answered as the endpoint itself would
    (`response.status_code` 400 and OpenAI's error body, param named as the endpoint names it); `error` repeats
    it with the line, so a client reading either finds it."""
    rid = request_id(job_id, index if index is not None else -(line or 0))
    response = None
    if status is not None:
        body_param = param.removeprefix("body.") if param else None
        response = {"status_code": status, "request_id": rid, "body": {"error": {
            "message": message, "type": "invalid_request_error", "param": body_param, "code": code}}}
    return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": response,
            "error": {"code": code, "message": message, "line": line, "param": param}, "metrics": None}


dumps = output_line_bytes
