"""A job as the OpenAI Batch object (`openai.types.Batch`): what the API returns and `status --json` prints."""
from __future__ import annotations

from batchinfer.db.models import Job
from batchinfer.jobs.files import error_file_id, output_file_id

TIMESTAMPS = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
              "cancelling_at", "cancelled_at", "expires_at")
DEFAULT_ENDPOINT = "/v1/chat/completions"


def completion_window(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size and not (unit == "d" and seconds == 86400):
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def batch_object(job: Job) -> dict:
    prompt, completion, cached = job.prompt_tokens or 0, job.completion_tokens or 0, job.cached_tokens or 0
    errors = job.errors or []
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint or DEFAULT_ENDPOINT,
        "model": job.model,
        "input_file_id": job.input_file_id or "",
        "completion_window": completion_window(job.completion_window_s),
        "status": job.status,
        "output_file_id": output_file_id(job.id) if job.output_key else None,
        "error_file_id": error_file_id(job.id) if job.error_key else None,
        "errors": {"object": "list", "data": errors, "count": job.error_count or len(errors)} if errors else None,
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                  "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": job.reasoning_tokens or 0},
                  "total_tokens": prompt + completion},
        "metadata": job.metadata_ or {},
        **{name: _int(getattr(job, name)) for name in TIMESTAMPS},
        # extras beside OpenAI's fields (SDK clients ignore them)
        "queued_at": _int(job.queued_at),
        "paused_at": _int(job.paused_at),  # its latest pause (status `paused` while it holds)
        "input_filename": job.input_filename or None,
        # services the batch waits for (storage, database, broker) while one is down; null otherwise (jobs.outage)
        "waiting_for": getattr(job, "waiting_for", None),
        "waiting_since": _int(getattr(job, "waiting_since", None)),
    }


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None
