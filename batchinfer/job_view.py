"""A job as people and scripts see it: a JSON object (OpenAI batch-like) and a rich table."""
from __future__ import annotations

from datetime import datetime, timezone

from rich.table import Column, Table

from batchinfer.db.models import Job

TIMESTAMPS = ("created_at", "queued_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
              "expired_at", "cancelling_at", "cancelled_at", "expires_at")


def job_dict(job: Job) -> dict:
    prompt = job.prompt_tokens or 0
    return {
        "id": job.id, "object": "batch", "status": job.status, "model": job.model,
        "input_file": job.input_filename, "output_file_key": job.output_key, "error_file_key": job.error_key,
        "completion_window_s": job.completion_window_s,
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "usage": {"prompt_tokens": prompt, "completion_tokens": job.completion_tokens,
                  "cached_tokens": job.cached_tokens,
                  "cache_hit_rate": round(job.cached_tokens / prompt, 4) if prompt else 0.0},
        "metadata": job.metadata_ or {},
        "errors": {"count": job.error_count, "data": job.errors or []},
        **{name: _int(getattr(job, name)) for name in TIMESTAMPS},
    }


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _when(value: int | None) -> str:
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def job_table(view: dict) -> Table:
    table = Table(show_header=False, box=None)
    counts, usage = view["request_counts"], view["usage"]
    table.add_row("id", view["id"])
    table.add_row("status", f"[bold]{view['status']}[/bold]")
    table.add_row("model", view["model"])
    table.add_row("requests", f"{counts['completed']} completed, {counts['failed']} failed, {counts['total']} total")
    table.add_row("tokens", f"{usage['prompt_tokens']} prompt ({usage['cached_tokens']} cached, "
                            f"hit rate {usage['cache_hit_rate']:.1%}), {usage['completion_tokens']} completion")
    if view["metadata"]:
        table.add_row("metadata", ", ".join(f"{k}={v}" for k, v in view["metadata"].items()))
    for name in TIMESTAMPS:
        if view[name]:
            table.add_row(name.removesuffix("_at").replace("_", " "), _when(view[name]))
    errors = view["errors"]
    if errors["count"]:
        shown = "\n".join(error_line(e) for e in errors["data"][:20])
        more = f"\n... and {errors['count'] - 20} more" if errors["count"] > 20 else ""
        table.add_row("errors", f"{errors['count']}\n{shown}{more}")
    return table


def error_line(error: dict) -> str:
    where = f"line {error['line']}" if error.get("line") is not None else "file"
    param = f" ({error['param']})" if error.get("param") else ""
    return f"{where}: {error['code']}{param}: {error['message']}"


def jobs_table(views: list[dict]) -> Table:
    table = Table(Column("id", no_wrap=True), "status", "completed", "failed", "total", Column("created", no_wrap=True))
    for v in views:
        c = v["request_counts"]
        table.add_row(v["id"], v["status"], str(c["completed"]), str(c["failed"]), str(c["total"]), _when(v["created_at"]))
    return table
