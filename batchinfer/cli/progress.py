"""What a person watching a batch sees: the in-process progress bar (requests, tokens/s, ETA), and the
lines `status --watch` prints when its output is not a terminal (one line per change)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RunProgress:
    """A rich progress bar over one job's in-process run; feed it each finished request (on_result). The run also
    takes up other jobs' units waiting in the same data directory (another `run` beside it, an interrupted one):
    only this job's requests move its bar."""

    def __init__(self, console: Console, total: int, quiet: bool = False, job_id: str | None = None):
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.progress = Progress(*columns, console=console, disable=quiet, transient=False)
        self.task = self.progress.add_task("loading model", total=total, rate="")
        self.tokens, self.started, self.job_id = 0, time.monotonic(), job_id

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def loaded(self) -> None:
        self.started = time.monotonic()
        self.progress.update(self.task, description="generating")

    def on_result(self, key, result) -> None:
        """key: the finished request's RequestKey."""
        if self.job_id is not None and key.job_id != self.job_id:
            return
        self.tokens += result.completion_tokens
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.progress.update(self.task, advance=1, rate=f"{self.tokens / elapsed:.0f} tok/s")


def eta_s(batch: dict, now: float | None = None) -> float | None:
    """Seconds left at this batch's own measured pace (requests finished since it started), or None."""
    counts = batch["request_counts"]
    done = counts["completed"] + counts["failed"]
    started = batch.get("in_progress_at")
    if not started or not done or done >= counts["total"]:
        return None
    elapsed = (now or time.time()) - started
    return elapsed * (counts["total"] - done) / done


def watch_line(batch: dict) -> str:
    """One line for a script or a log: time, status, counts, tokens and the ETA."""
    counts, usage = batch["request_counts"], batch["usage"]
    clock = datetime.now(timezone.utc).strftime("%H:%M:%S")
    eta = eta_s(batch)
    tail = f", ETA {eta:.0f} s (this batch's pace)" if eta is not None else ""
    if eta is None and batch.get("estimated_remaining_s") is not None:
        tail = f", ETA {batch['estimated_remaining_s']:.0f} s ({batch['estimate_source']})"
    if batch.get("waiting_for"):
        tail += f"; waiting for {' and '.join(batch['waiting_for'])}"
    return (f"{clock} {batch['id']} {batch['status']}: {counts['completed']} completed, {counts['failed']} failed, "
            f"{counts['total']} total; {usage['output_tokens']} completion tokens{tail}")


def changed(before: dict | None, after: dict) -> bool:
    keys = ("status", "request_counts", "usage", "waiting_for")
    return before is None or any(before.get(k) != after.get(k) for k in keys)
