"""The first thing every request meets (a plain ASGI middleware, outside FastAPI's body parsing):
security headers on every answer; for /v1 and /metrics the key is checked from the headers before any byte
of the body is read; then the key's request rate and its uploads and estimates in flight (in Redis, shared by
every server, when the broker is Redis: api/shared_limits.py); bodies are counted as they arrive, chunked or
not, and cut off at the first byte past their limit (413). Failed authentications are throttled per client
address."""
from __future__ import annotations

import hmac
from urllib.parse import unquote

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchinfer.api.auth import INVALID, MISSING, bearer
from batchinfer.api.errors import body
from batchinfer.api.shared_limits import open_limits
from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey
from batchinfer.jobs.tenancy import tenants
from batchinfer.jobs.user_text import has_control

SECURITY_HEADERS = [(b"content-security-policy", b"default-src 'self'"), (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
MULTIPART_OVERHEAD = 16 * 1024  # an upload's body may pass max_file_bytes by this: boundaries, the purpose field
# an Anthropic create is an upload too: its body holds the batch's requests
IN_FLIGHT_KINDS = {("POST", "/v1/files"): "uploads", ("POST", "/v1/messages/batches"): "uploads",
                   ("POST", "/v1/batches/estimate"): "estimates"}


class BodyTooLarge(HTTPException):
    """Raised from receive(); an HTTPException so that FastAPI's body parsing passes it on as it is."""


def _refusal(status: int, message: str, code: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body(status, message, code), status_code=status, headers=headers)


def _too_large(limit: int, code: str) -> JSONResponse:
    return _refusal(413, f"The request body is over the {limit}-byte limit.", code)


def _secured(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
        await send(message)
    return sending


class _Capped:
    """receive() that counts body bytes and raises at the first chunk past the limit (the chunk is dropped);
    send() that then answers 413 whatever the app made of the cut body."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: tuple[int, str]):
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.code = limit
        self.count, self.over, self.answered = 0, False, False

    def too_large(self) -> JSONResponse:
        return _too_large(self.limit, self.code)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.count += len(message.get("body", b""))
            if self.count > self.limit:
                self.over = True
                raise BodyTooLarge(413, f"The request body is over the {self.limit}-byte limit.")
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self.answered:
                return
            self.answered = True
            if self.over:
                await self.too_large()(self.scope, self._receive, self._send)
                return
        elif self.over:
            return
        await self._send(message)


class Guard:
    def __init__(self, app: ASGIApp, ctx: AppContext):
        self.app, self.ctx = app, ctx
        self.limits = open_limits(ctx.settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _secured(send)
        refusal, kind, key = await self._admit(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        ticket = await self.limits.enter(kind, key.id) if kind and key else None
        if kind and key and ticket is None:
            await _refusal(429, f"Too many {kind} of this key at once (at most {self.limits.limit(kind)}).",
                           f"too_many_{kind}", retry_after=1)(scope, receive, send)
            return
        capped = _Capped(scope, receive, send, self._body_limit(scope))
        try:
            await self.app(scope, capped.receive, capped.send)
        except BodyTooLarge:
            if not capped.answered:
                await capped.too_large()(scope, receive, send)
        finally:
            if ticket is not None:
                await self.limits.leave(ticket)

    def _body_limit(self, scope: Scope) -> tuple[int, str]:
        """(bytes, the error code past them)."""
        s = self.ctx.settings
        route = (scope["method"], scope["path"].rstrip("/"))
        if route == ("POST", "/v1/files"):
            return s.max_file_bytes + MULTIPART_OVERHEAD, "file_too_large"
        if route == ("POST", "/v1/messages/batches"):  # Anthropic's batches carry their requests inline
            return s.max_message_batch_bytes, "file_too_large"
        return s.max_json_bytes, "request_too_large"

    async def _admit(self, scope: Scope) -> tuple[JSONResponse | None, str | None, ApiKey | None]:
        """(a refusal or None, the in-flight kind of the request, its key)."""
        path = scope["path"]
        if has_control(path) or has_control(unquote(scope.get("query_string", b"").decode("latin-1"))):
            # an id or cursor with NUL would reach PostgreSQL, which cannot hold it
            return _refusal(400, "The URL holds control characters.", "invalid_url"), None, None
        if path != "/metrics" and not path.startswith("/v1/"):
            return None, None, None  # the health check and the dashboard's static files
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        limit = self._body_limit(scope)
        if declared.isdigit() and int(declared) > limit[0]:
            return _too_large(*limit), None, None
        client = (scope.get("client") or ("unknown",))[0]
        wait = await self.limits.auth_wait(client)
        if wait:
            return _refusal(429, "Too many failed authentications from this address.", "too_many_auth_failures",
                            wait), None, None
        secret = bearer(headers.get("authorization", "")) or headers.get("x-api-key", "").strip()  # x-api-key: Anthropic's
        if path == "/metrics" and secret and self._is_metrics_token(secret):
            return None, None, None
        key = await run_in_threadpool(tenants.authenticate, self.ctx, secret) if secret else None
        if key is None:
            if secret:  # a wrong guess (a missing key costs no lookup)
                await self.limits.auth_failed(client)
            return _refusal(*(INVALID if secret else MISSING)), None, None
        if path == "/metrics" and not key.is_admin:
            return _refusal(403, "Only an admin key or the metrics token reads /metrics.", "not_admin"), None, None
        scope.setdefault("state", {})["api_key"] = key
        wait = await self.limits.take(key.id)
        if wait:
            return _refusal(429, "Too many requests for this key; slow down.", "rate_limit_exceeded", wait), None, None
        return None, IN_FLIGHT_KINDS.get((scope["method"], path.rstrip("/"))), key

    def _is_metrics_token(self, secret: str) -> bool:
        token = self.ctx.settings.metrics_token
        return token is not None and hmac.compare_digest(secret.encode(), token.encode())
