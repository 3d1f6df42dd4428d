"""What `status` says of the time left: the plan's figure (and where it came from) before a batch's first
request finishes, the batch's own pace after."""
import time

import pytest
from rich.console import Console

from batchinfer.cli.progress import watch_line
from batchinfer.cli.render import job_table

pytestmark = pytest.mark.fast


def batch(completed: int, **extra) -> dict:
    return {"id": "batch_1", "status": "in_progress", "model": "m", "metadata": {}, "errors": None,
            "request_counts": {"total": 10, "completed": completed, "failed": 0},
            "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0},
            "created_at": int(time.time()) - 20, "in_progress_at": int(time.time()) - 10, **extra}


def shown(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_before_the_first_request_the_plans_eta_and_its_source_are_shown():
    planned = batch(0, estimated_remaining_s=42.0, estimate_source="plan at the measured rates (measured on vm)")
    assert "ETA 42 s (plan at the measured rates (measured on vm))" in watch_line(planned)
    assert "42 s (plan at the measured rates" in shown(job_table(planned))
    assert "ETA" not in watch_line(batch(0)) and "ETA" not in shown(job_table(batch(0)))


def test_once_requests_finish_the_batchs_own_pace_is_shown():
    paced = batch(5, estimated_remaining_s=42.0, estimate_source="plan")
    assert "this batch's pace" in watch_line(paced) and "plan" not in watch_line(paced)
    assert "at this batch's pace so far" in shown(job_table(paced))
