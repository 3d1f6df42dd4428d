"""The one cache key of the engine: a file derived from another is named by its source's path, size and mtime."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_key(source: Path, *salt: object) -> str:
    """16 hex digits that change when `source` is replaced or touched, or when `salt` (a layout version) changes."""
    stat = source.stat()
    parts = [str(source.resolve()), str(stat.st_size), str(stat.st_mtime_ns), *(str(s) for s in salt)]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()[:16]
