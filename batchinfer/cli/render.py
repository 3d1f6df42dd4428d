"""What the CLI prints for people: batches, plans, prefix groups and workers as rich tables."""
from __future__ import annotations

from datetime import datetime, timezone

from rich import box
from rich.table import Column, Table
from rich.text import Text

from batchinfer.cli.progress import eta_s
from batchinfer.cluster.registry import WorkerState, open_registry
from batchinfer.errors import excerpt
from batchinfer.jobs.views.reports import GroupFigures
from batchinfer.planner import PlanEstimate
from batchinfer.settings import Settings

TIMESTAMPS = ("created_at", "queued_at", "in_progress_at", "paused_at", "finalizing_at", "completed_at", "failed_at",
              "expired_at", "cancelling_at", "cancelled_at", "expires_at")


def literal(value) -> Text:
    """User text (ids, names, metadata, messages) as rich prints it verbatim: never markup, never an emoji code."""
    return Text(str(value))


def _when(value: int | None, zone: bool = True) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S" + (" UTC" if zone else ""))


def hit_rate(batch: dict) -> float:
    usage = batch["usage"]
    return usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"] if usage["input_tokens"] else 0.0


def job_table(batch: dict) -> Table:
    """A Batch object (jobs.views.batch_view) for people. User text is data, never markup."""
    table = Table(show_header=False, box=None)
    counts, usage = batch["request_counts"], batch["usage"]
    table.add_row("id", literal(batch["id"]))
    table.add_row("status", Text(str(batch["status"]), style="bold"))
    table.add_row("model", literal(batch["model"] or ""))
    table.add_row("requests", f"{counts['completed']} completed, {counts['failed']} failed, {counts['total']} total")
    table.add_row("tokens", f"{usage['input_tokens']} prompt ({usage['input_tokens_details']['cached_tokens']} cached, "
                            f"hit rate {hit_rate(batch):.1%}), {usage['output_tokens']} completion")
    if batch.get("input_filename"):
        table.add_row("input file", literal(excerpt(batch["input_filename"])))
    if batch["metadata"]:
        table.add_row("metadata", literal(excerpt(", ".join(f"{k}={v}" for k, v in batch["metadata"].items()))))
    if batch.get("waiting_for"):
        table.add_row("waiting for", Text(waiting_text(batch), style="bold yellow"))
    eta = eta_s(batch) if batch["status"] == "in_progress" else None
    if eta is not None:
        table.add_row("ETA", f"{eta:.0f} s (at this batch's pace so far)")
    elif batch.get("estimated_remaining_s") is not None:  # nothing finished yet: the plan's figure
        table.add_row("ETA", literal(f"{batch['estimated_remaining_s']:.0f} s ({batch['estimate_source']})"))
    # in the order they happened (expires last: it is a deadline, not an event)
    events = sorted((batch[name], name) for name in TIMESTAMPS if batch.get(name) and name != "expires_at")
    for when, name in events + ([(batch["expires_at"], "expires_at")] if batch.get("expires_at") else []):
        table.add_row(name.removesuffix("_at").replace("_", " "), _when(when))
    errors = batch["errors"]
    if errors:
        count = errors.get("count", len(errors["data"]))
        shown = "\n".join(error_line(e) for e in errors["data"][:20])
        more = f"\n... and {count - 20} more" if count > 20 else ""
        table.add_row("errors", literal(f"{count}\n{shown}{more}"))
    return table


def waiting_text(batch: dict) -> str:
    """What a batch waits for while a service is down: nothing failed, it resumes by itself."""
    since = f" since {_when(batch['waiting_since'])}" if batch.get("waiting_since") else ""
    return f"{' and '.join(batch['waiting_for'])} (unreachable{since}); the batch resumes when it answers"


def error_line(error: dict) -> str:
    where = f"line {error['line']}" if error.get("line") is not None else "file"
    param = f" ({error['param']})" if error.get("param") else ""
    return excerpt(f"{where}: {error['code']}{param}: {error['message']}")


def _rows_table(*columns: Column, **options) -> Table:
    """A table with headers that fits 80 columns (the default width of a terminal or a pipe): no
    vertical rules, and a value too wide for its column folds onto the next line instead of being cut."""
    return Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, **options)


def _folding(header: str, **options) -> Column:
    return Column(header, overflow="fold", **options)


def _count(header: str) -> Column:
    return Column(header, justify="right", no_wrap=True)


def jobs_table(batches: list[dict], width: int = 80) -> Table:
    """One row per job, the id whole on one line (people copy it). Narrower than 100 columns the counts
    share one column (done/total: the failed count is in `status`) and the date loses its year and seconds."""
    wide = width >= 100
    counts = (_count("completed"), _count("failed"), _count("total")) if wide else (_count("done/total"),)
    table = _rows_table(Column("id", no_wrap=True), Column("status", no_wrap=True), *counts,
                        Column("created (UTC)", no_wrap=True))
    for b in batches:
        c = b["request_counts"]
        figures = ((str(c["completed"]), str(c["failed"]), str(c["total"])) if wide
                   else (f"{c['completed'] + c['failed']}/{c['total']}",))
        created = _when(b["created_at"], zone=False)
        table.add_row(literal(b["id"]), literal(b["status"]), *figures, created if wide else created[5:16])
    return table


def plan_table(est: PlanEstimate) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("requests", str(est.requests))
    table.add_row("prompt tokens", str(est.prompt_tokens))
    table.add_row("max new tokens", str(est.max_new_tokens))
    groups = str(est.prefix_groups)
    if not est.prefix_groups and est.expected_cached_tokens:
        groups += " (no long shared prefix; shorter shared blocks still hit the cache)"
    table.add_row("prefix groups", groups)
    table.add_row("expected cached tokens", f"{est.expected_cached_tokens} ({est.expected_hit_rate:.1%} of prompt tokens)")
    table.add_row("work units", str(est.units))
    run = f"{est.estimated_run_s:.0f} s" if est.estimated_run_s is not None else "unknown"
    table.add_row("estimated run time", f"{run} on {est.workers} worker(s), every request running to max_tokens")
    if est.rate_source:
        table.add_row("rates", est.rate_source)
    return table


def known_workers(settings: Settings) -> list[WorkerState]:
    """The live workers with their measured rates; in embedded mode, this process."""
    if settings.embedded:
        return [WorkerState("embedded")]
    return open_registry(settings).live()


def groups_table(groups: list[GroupFigures]):
    rows = [(literal(g.prefix_key), str(g.shared_prefix_len), f"{g.done}/{g.requests}", f"{g.units_done}/{g.units}",
             f"{g.cached_tokens}/{g.prompt_tokens}", f"{g.hit_rate:.1%}", literal(", ".join(g.workers) or "-")) for g in groups]
    headers = ("shared tokens", "requests", "units", "cached / prompt tokens", "hit rate")
    # A figure is never folded: its column is at least as wide as its widest value; headers wrap instead.
    figures = [Column(h, min_width=max((len(row[i + 1]) for row in rows), default=0)) for i, h in enumerate(headers)]
    adapters = any(g.adapter for g in groups)  # a batch on the base alone shows no adapter column
    table = _rows_table(_folding("prefix group"), *([_folding("adapter")] if adapters else []), *figures,
                        _folding("workers"), title="progress by prefix group")
    for g, row in zip(groups, rows):
        table.add_row(row[0], *([literal(g.adapter or "-")] if adapters else []), *row[1:])
    return table


def groups_table_of(groups: list[dict]) -> Table:
    """Prefix groups as the API returns them (GroupFigures.to_dict)."""
    fields = GroupFigures.__dataclass_fields__
    return groups_table([GroupFigures(**{k: v for k, v in g.items() if k in fields}) for g in groups])


def keys_table(rows: list[dict]) -> Table:
    table = _rows_table(_folding("id"), _folding("name"), _folding("org"), _folding("created"), _folding("revoked"))
    for row in rows:
        table.add_row(literal(row["id"]), literal(row["name"]), literal(row["org"] or "-"), _when(row["created_at"]),
                      _when(row["revoked_at"]))
    return table
