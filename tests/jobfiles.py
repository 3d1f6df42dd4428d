"""Helpers to submit small jobs and read their files in tests."""
from __future__ import annotations

import io
import json

from batchinfer.jobs import service


def submit_lines(ctx, lines: list[str], **kwargs):
    return service.submit(ctx, io.BytesIO(("\n".join(lines) + "\n").encode()), "test.jsonl", **kwargs)


def read_output(ctx, job_id: str, errors: bool = False) -> list[dict]:
    target = io.BytesIO()
    if not service.download(ctx, job_id, target, errors=errors):
        return []
    return [json.loads(line) for line in target.getvalue().splitlines()]


def chat_line(custom_id: str, content: str, max_tokens: int = 2, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": content}],
                                "max_tokens": max_tokens, "temperature": 0, **body}})


def completion_line(custom_id: str, prompt: str, max_tokens: int = 2, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0, **body}})
