"""Every error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, with OpenAI's codes and wording
where OpenAI has them (batchinfer.error_codes)."""
from __future__ import annotations

from typing import cast

from fastapi import FastAPI, Request
from pydantic_core import ErrorDetails
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sqlalchemy.exc import InterfaceError, OperationalError

from batchinfer.db.session import is_transient_db
from batchinfer.errors import BatchInferError, InvalidRequest, JobConflict, JobNotFound, TooManyActive
from batchinfer.jobs.idempotency import IdempotencyConflict
from batchinfer.jobs.intake.line_problems import openai_problem

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
          409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message[:1000], "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def _reply(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body(status, message, code, param), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return _reply(exc.status, exc.message, exc.code, exc.param)

    @app.exception_handler(JobNotFound)
    async def _not_found(_: Request, exc: JobNotFound):
        return _reply(404, str(exc), exc.code or "not_found", exc.param)

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest):
        if exc.code is not None:
            return _reply(400, str(exc), exc.code, exc.param)
        return _reply(400, str(exc), str(exc).split(":", 1)[0] if ":" in str(exc) else None)

    @app.exception_handler(JobConflict)
    async def _conflict(_: Request, exc: JobConflict):
        return _reply(409, str(exc), exc.code, exc.param)  # OpenAI's cannot-cancel answer has no code

    @app.exception_handler(IdempotencyConflict)
    async def _idempotency_conflict(_: Request, exc: IdempotencyConflict):
        return _reply(409, str(exc), "idempotency_conflict", "idempotency_key")

    @app.exception_handler(TooManyActive)
    async def _too_many(_: Request, exc: TooManyActive):
        return _reply(429, str(exc), "too_many_active_batches")

    @app.exception_handler(BatchInferError)
    async def _other(_: Request, exc: BatchInferError):
        return _reply(400, str(exc))

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_: Request, exc: Exception):
        if not is_transient_db(exc):
            return _reply(500, "Internal server error.")
        reply = _reply(503, "Waiting for the database: it does not answer. Batches resume by themselves once it is back; "
                            "nothing fails for it.", "database_unavailable")
        reply.headers["Retry-After"] = "5"
        return reply

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError):
        """The first problem of a JSON body or query, in OpenAI's code and wording (line_problems.openai_problem)."""
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid" or not first:
            return _reply(400, "We could not parse the JSON body of your request.", "invalid_request", None)
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        code, message = openai_problem(cast(ErrorDetails, first), param or "request", first.get("input"))
        return _reply(400, message, code, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return _reply(exc.status_code, str(exc.detail))
