"""What the cluster relies on in kombu's Redis transport, taken from kombu itself: a queue is one Redis
list per priority step (the step after a separator in the list's name), served lowest step first.

kombu is imported on first use: it brings redis with it (~0.3 s), and `batchinfer run` and the CLI's other
commands import this module without ever talking to a broker.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _kombu_priorities() -> tuple[list[int], str]:
    from kombu.transport.redis import PRIORITY_STEPS, Channel  # lazy: kombu and redis (see the docstring)

    return list(PRIORITY_STEPS), Channel.sep


def broker_priority(level: int) -> int:
    """The Celery task priority that puts a unit of this service level (0 runs first) on its own step."""
    steps, _ = _kombu_priorities()
    return steps[min(max(level, 0), len(steps) - 1)]


def priority_list_keys(list_key: str) -> list[str]:
    """The broker's lists of one queue, served first to last."""
    steps, sep = _kombu_priorities()
    return [list_key + (f"{sep}{step}" if step else "") for step in steps]
