"""How a command asks for more work: the worker's tasks send it through the broker (workers/tasks.py)."""
from __future__ import annotations

from typing import Protocol


class Sender(Protocol):
    def unit(self, unit_id: str, queue: str, level: int | None = None, priority: int | None = None) -> None:
        """Run a unit on `queue`, at its service level (0 runs first), or at a broker `priority` already mapped
        (neither: the broker's default)."""

    def dispatch(self, round_no: int = 0, countdown: float | None = None) -> None:
        """A dispatch round, `countdown` seconds from now."""

    def validation(self, job_id: str) -> None:
        """Validate a stored job on a worker."""
