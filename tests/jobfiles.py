"""Helpers to submit small jobs and read their files in tests."""
from __future__ import annotations

import io
import json

from batchinfer import service


def submit_lines(ctx, lines: list[str], **kwargs):
    return service.submit(ctx, io.BytesIO(("\n".join(lines) + "\n").encode()), "test.jsonl", **kwargs)


def read_output(ctx, job_id: str, errors: bool = False) -> list[dict]:
    target = io.BytesIO()
    if not service.download(ctx, job_id, target, errors=errors):
        return []
    return [json.loads(line) for line in target.getvalue().splitlines()]
