"""Which Celery queue a work unit goes to.

This first version sends everything to the shared queue; prefix-affinity routing replaces it (issue 4).
"""
from __future__ import annotations

SHARED_QUEUE = "batchinfer"


def worker_queue(worker_name: str) -> str:
    """The queue only one worker consumes (besides the shared one)."""
    return f"{SHARED_QUEUE}.worker.{worker_name}"


def choose_queue(prefix_key: str, live_workers: list[str]) -> str:
    return SHARED_QUEUE
