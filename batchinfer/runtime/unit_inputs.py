"""Unit inputs this process wrote, kept for the units it then runs itself (one worker dispatches and runs; so does
`batchinfer run`): such a unit takes its requests from memory instead of a GET and a parse of every line.

The stored input stays the truth: a unit this process did not dispatch, a rerun, or one past the bounds reads it
from storage. Each entry is taken once (a rerun reads storage), and is dropped when its unit never runs here.
"""
from __future__ import annotations

import threading
import time
import weakref

from batchinfer.jobs.output.records import UnitRequest
from batchinfer.storage import Storage

MAX_TOKENS = 4_000_000  # prompt tokens held at most: ~16 MB of token ids (arrays), 50,000 short chat requests
MAX_AGE_S = 300.0  # an entry whose unit ran elsewhere (another worker took it) is dropped this long after


class UnitInputs:
    def __init__(self, max_tokens: int = MAX_TOKENS, max_age_s: float = MAX_AGE_S):
        self.max_tokens, self.max_age_s = max_tokens, max_age_s
        self._entries: dict[str, tuple[float, int, list[UnitRequest]]] = {}  # insertion order: oldest first
        self._tokens = 0
        self._lock = threading.Lock()

    def put(self, unit_id: str, requests: list[UnitRequest]) -> bool:
        """Keep a unit's input once stored; False (not kept) past the bound: its unit reads storage."""
        tokens = sum(len(r.request.prompt_token_ids) for r in requests)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if self._tokens + tokens > self.max_tokens:
                return False
            self._entries[unit_id] = (now, tokens, requests)
            self._tokens += tokens
            return True

    def take(self, unit_id: str) -> list[UnitRequest] | None:
        with self._lock:
            entry = self._entries.pop(unit_id, None)
            if entry is None:
                return None
            self._tokens -= entry[1]
            return entry[2]

    def _expire(self, now: float) -> None:
        for unit_id, (kept_at, tokens, _) in list(self._entries.items()):
            if now - kept_at < self.max_age_s:
                break
            del self._entries[unit_id]
            self._tokens -= tokens


_held: weakref.WeakKeyDictionary[Storage, UnitInputs] = weakref.WeakKeyDictionary()
_held_lock = threading.Lock()


def unit_inputs(storage: Storage) -> UnitInputs:
    """The inputs written through this storage object (one per context): a context on another store never sees them."""
    with _held_lock:
        found = _held.get(storage)
        if found is None:
            found = _held[storage] = UnitInputs()
        return found
