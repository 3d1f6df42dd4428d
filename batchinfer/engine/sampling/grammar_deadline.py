"""A grammar compile with a deadline, and the check of a constraint cached by its hash.

xgrammar releases the GIL while it compiles, so the compile runs in its own thread and the caller stops waiting at
the deadline (the thread cannot be stopped: it finishes in the background, and the budget's bounds keep that rare).
A constraint is checked once per process: a file of 10,000 lines that share one schema compiles it once."""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")

COMPILE_DEADLINE_S = 2.0  # a schema inside the budget compiles in well under 0.2 s
CACHE_ENTRIES = 1024


class CompileTooSlow(Exception):
    """The compile ran past its deadline."""


def within_deadline(compile_it: Callable[[], T], deadline_s: float = COMPILE_DEADLINE_S) -> T:
    """compile_it's result, or CompileTooSlow once deadline_s passes (its exception, if it raised one)."""
    done: dict[str, object] = {}

    def run() -> None:
        try:
            done["value"] = compile_it()
        except BaseException as exc:  # handed to the caller's thread
            done["error"] = exc

    thread = threading.Thread(target=run, name="grammar-compile", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise CompileTooSlow(f"it takes over {deadline_s:g} s to compile")
    if "error" in done:
        raise done["error"]  # type: ignore[misc]
    return done["value"]  # type: ignore[return-value]


def compile_error(exc: BaseException) -> str:
    """A failed compile's reason: the first line of the grammar library's message, short."""
    return str(exc).splitlines()[0][:200] if str(exc) else "no reason given"


def constraint_key(kind: str, spec: str) -> str:
    """One key per distinct constraint: its hash, not its (up to 64 KiB) text."""
    return hashlib.sha256(f"{kind}\0{spec}".encode()).hexdigest()


@dataclass
class CheckCache:
    """The reasons found per constraint hash (None: it compiles), least recently used dropped first."""

    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        self._found: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_check(self, kind: str, spec: str, check: Callable[[str, str], str | None]) -> str | None:
        key = constraint_key(kind, spec)
        with self._lock:
            if key in self._found:
                self.hits += 1
                self._found.move_to_end(key)
                return self._found[key]
            self.misses += 1
        reason = check(kind, spec)
        with self._lock:
            self._found[key] = reason
            while len(self._found) > CACHE_ENTRIES:
                self._found.popitem(last=False)
        return reason


CHECKS = CheckCache()  # this process's: validation and the API share it
