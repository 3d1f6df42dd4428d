"""A job as people and scripts see it: a JSON object (OpenAI batch-like) and a rich table."""
from __future__ import annotations

from datetime import datetime, timezone

from rich.table import Column, Table

from batchinfer.cluster.registry import WorkerState
from batchinfer.db.models import Job
from batchinfer.jobs.reports import GroupFigures
from batchinfer.planner import PlanEstimate
from batchinfer.settings import Settings

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


def plan_table(est: PlanEstimate) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("requests", str(est.requests))
    table.add_row("prompt tokens", str(est.prompt_tokens))
    table.add_row("max new tokens", str(est.max_new_tokens))
    table.add_row("prefix groups", str(est.prefix_groups))
    table.add_row("expected cached tokens", f"{est.expected_cached_tokens} ({est.expected_hit_rate:.1%} of prompt tokens)")
    table.add_row("work units", str(est.units))
    run = f"{est.estimated_run_s:.0f} s" if est.estimated_run_s is not None else "unknown"
    table.add_row("estimated run time", f"{run} on {est.workers} worker(s) (upper bound: every request runs to max_tokens)")
    return table


def known_workers(settings: Settings) -> list[WorkerState]:
    """The live workers with their measured rates; in embedded mode, this process."""
    if settings.embedded:
        return [WorkerState("embedded")]
    from batchinfer.cluster.registry import open_registry

    return open_registry(settings).live()


def groups_table(groups: list[GroupFigures]):
    table = Table(Column("prefix group", no_wrap=True), "shared tokens", "requests", "units", "cached / prompt tokens", "hit rate", "workers",
                  title="progress by prefix group")
    for g in groups:
        table.add_row(g.prefix_key, str(g.shared_prefix_len), f"{g.done}/{g.requests}", f"{g.units_done}/{g.units}",
                      f"{g.cached_tokens}/{g.prompt_tokens}", f"{g.hit_rate:.1%}", ", ".join(g.workers) or "-")
    return table
