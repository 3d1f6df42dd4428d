"""What the cluster relies on in kombu's Redis transport, taken from kombu itself: a queue is one Redis
list per priority step (the step after a separator in the list's name), served lowest step first."""
from __future__ import annotations

from kombu.transport.redis import PRIORITY_STEPS, Channel

PRIORITY_SEP = Channel.sep


def broker_priority(level: int) -> int:
    """The Celery task priority that puts a unit of this service level (0 runs first) on its own step."""
    return PRIORITY_STEPS[min(max(level, 0), len(PRIORITY_STEPS) - 1)]


def priority_list_keys(list_key: str) -> list[str]:
    """The broker's lists of one queue, served first to last."""
    return [list_key + (f"{PRIORITY_SEP}{step}" if step else "") for step in PRIORITY_STEPS]
