"""One line per request on stderr: method, route, status, milliseconds and the API key's id (never its secret)."""
from __future__ import annotations

import logging
import sys
import time

from fastapi import FastAPI, Request

log = logging.getLogger("batchinfer.access")


def install(app: FastAPI) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    @app.middleware("http")
    async def _access(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"  # the template: no ids in the log
        key = getattr(request.state, "api_key", None)  # set by the guard once the key checked out
        key_id = key.id if key is not None else "-"
        log.info("%s %s %d %.1f ms key=%s", request.method, route, response.status_code,
                 (time.perf_counter() - started) * 1000, key_id)
        return response
